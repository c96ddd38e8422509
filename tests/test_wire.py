"""The ZeroMQ wire format: round trips and every kind of malformed message."""
import json
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfhmm.io.wire import (ERROR_KINDS, MAX_HEADER_BYTES, MAX_TOPIC_BYTES, Heartbeat,
                                PosteriorMessage, Sample, WireError, decode_input, decode_output,
                                encode_heartbeat, encode_posterior, encode_sample,
                                encode_service_heartbeat, max_frame_bytes, max_json_bytes,
                                subscription_prefixes)
from streamfhmm.stream.posterior import Posterior
from streamfhmm.io.wire import TsText, encode_posterior_batch

SEED = 20240611


def _post(M=3, D=2, t=5, version=2, flags=1, seed=SEED):
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    return Posterior(t=t, theta=rng.uniform(size=M), rho=rng.uniform(-1, 1, size=M),
                     mean=rng.standard_normal(D), version=version, flags=flags)


# -- round trips --------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["binary", "json"])
def test_sample_round_trip(fmt):
    print(f"seed={SEED}")
    x = np.random.default_rng(SEED).standard_normal(7) * 1e3
    x[3] = np.nan
    frames = encode_sample("sensor-1", 123456789, 1.7e9 + 0.25, x, format=fmt)
    assert len(frames) == (3 if fmt == "binary" else 1)
    s = decode_input(frames, n_features=7)
    assert type(s) is Sample
    assert s.topic == b"sensor-1" and s.seq == 123456789 and s.ts == 1.7e9 + 0.25
    np.testing.assert_array_equal(np.isnan(s.values), np.isnan(x))
    np.testing.assert_array_equal(s.values[~np.isnan(x)], x[~np.isnan(x)])  # bit-exact
    assert s.values.dtype == np.float64 and not s.values.flags.writeable


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=20),
       st.integers(0, 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False),
       st.text(max_size=20), st.sampled_from(["binary", "json"]))
def test_sample_round_trip_any(values, seq, ts, topic, fmt):
    x = np.array(values)
    s = decode_input(encode_sample(topic, seq, ts, x, format=fmt), n_features=len(values))
    assert s.topic == topic.encode("utf-8") and s.seq == seq and s.ts == ts
    np.testing.assert_array_equal(s.values, x)


def test_binary_payload_is_little_endian_float64():
    frames = encode_sample(b"t", 0, 0.0, [1.0, -2.5])
    assert frames[2] == np.array([1.0, -2.5], dtype="<f8").tobytes()
    assert json.loads(frames[1]) == {"seq": 0, "ts": 0.0}
    # a big-endian producer's bytes read as little-endian are other numbers, not an error
    s = decode_input([b"t", b'{"seq":0,"ts":0}', np.array([1.0, 2.0], dtype=">f8").tobytes()], 2)
    assert s.values[0] != 1.0


def test_extra_header_keys_are_ignored_and_int_ts_accepted():
    s = decode_input([b"a", b'{"seq":3,"ts":17,"unit":"W"}', np.zeros(2).tobytes()], 2)
    assert s.seq == 3 and s.ts == 17.0 and type(s.ts) is float


def test_json_null_is_missing_and_topic_defaults_to_empty():
    s = decode_input([b'{"seq":1,"ts":2.5,"values":[1,null,3]}'], 3)
    assert s.topic == b""
    assert np.isnan(s.values[1]) and s.values[0] == 1.0 and s.values[2] == 3.0


@pytest.mark.parametrize("fmt", ["binary", "json"])
def test_posterior_round_trip(fmt):
    p = _post(M=3, D=2)
    frames = encode_posterior(b"house/1", 42, 1.5, p, format=fmt)
    m = decode_output(frames)
    assert type(m) is PosteriorMessage
    assert (m.topic, m.seq, m.t, m.ts, m.version, m.flags) == (b"house/1", 42, 5, 1.5, 2, 1)
    np.testing.assert_array_equal(m.theta, p.theta)
    np.testing.assert_array_equal(m.rho, p.rho)
    np.testing.assert_array_equal(m.mean, p.mean)


def test_binary_posterior_layout():
    p = _post(M=2, D=3)
    topic, header, payload = encode_posterior(b"x", 9, 2.0, p)
    h = json.loads(header)
    assert h == {"seq": 9, "t": 5, "ts": 2.0, "version": 2, "flags": 1, "n_chains": 2}
    v = np.frombuffer(payload, dtype="<f8")
    assert v.shape == (2 * 2 + 3,)
    np.testing.assert_array_equal(v, np.concatenate([p.theta, p.rho, p.mean]))


def test_json_posterior_starts_with_topic():
    frame = encode_posterior(b"abc", 1, 0.0, _post(), format="json")[0]
    assert frame.startswith(b'{"topic":"abc"')
    assert any(frame.startswith(p) for p in subscription_prefixes("ab"))


@pytest.mark.parametrize("fmt", ["binary", "json"])
def test_heartbeats_round_trip(fmt):
    hb = decode_input(encode_heartbeat(b"s", 41, 3.0, end=True, format=fmt), n_features=4)
    assert hb == Heartbeat(b"s", 41, 3.0, True)
    hb = decode_input(encode_heartbeat(b"s", -1, 3.0, format=fmt), n_features=4)
    assert hb.seq == -1 and not hb.end
    out = decode_output(encode_heartbeat(b"s", 7, 4.0, format=fmt, t=8))
    assert type(out) is Heartbeat and (out.topic, out.seq, out.t, out.ts) == (b"s", 7, 8, 4.0)
    svc = decode_output(encode_service_heartbeat(3, 5.0, format=fmt))
    assert type(svc) is Heartbeat and svc.topic == b"" and svc.streams == 3


def test_subscription_prefixes():
    assert subscription_prefixes(b"") == [b""]
    assert subscription_prefixes("ab") == [b"ab", b'{"topic":"ab']
    frames = encode_sample("abc", 0, 0.0, [1.0], format="json")
    assert frames[0].startswith(subscription_prefixes("ab")[1])
    assert not frames[0].startswith(subscription_prefixes("b")[1])


def test_subscription_prefixes_select_json_topics_written_as_raw_utf8():
    """A non-ASCII topic in compact JSON may be written escaped (Python's json) or as raw
    UTF-8 (JavaScript, serde_json): both are decoded, and the subscription selects both
    (ZeroMQ dropped the raw form before the service saw it: not even counted)."""
    import json
    subs = subscription_prefixes("caf")  # ASCII: the two JSON forms are one
    assert subs == [b"caf", b'{"topic":"caf']
    subs = subscription_prefixes("café")
    for ascii_only in (True, False):
        frame = json.dumps({"topic": "café-1", "seq": 3, "ts": 1.5, "values": [1.0, 2.0]},
                           separators=(",", ":"), ensure_ascii=ascii_only).encode("utf-8")
        assert any(frame.startswith(p) for p in subs), frame
        assert decode_input([frame], n_features=2).topic == "café-1".encode("utf-8")
    assert not any(b'{"topic":"cafe'.startswith(p) for p in subs)


def test_bounds():
    assert max_json_bytes(10) == 2048 + 320
    assert max_frame_bytes(10_000) == max(max_json_bytes(10_000), 80_000)
    assert max_frame_bytes(1) >= MAX_HEADER_BYTES


def test_encode_refuses_bad_topic_and_format():
    with pytest.raises(ValueError, match="at most 255 bytes"):
        encode_sample(b"x" * 256, 0, 0.0, [1.0])
    with pytest.raises(ValueError, match="UTF-8"):
        encode_sample(b"\xff", 0, 0.0, [1.0])
    with pytest.raises(ValueError, match="format"):
        encode_sample(b"x", 0, 0.0, [1.0], format="xml")


@pytest.mark.parametrize("fmt", ["binary", "json"])
def test_encoders_take_numpy_numbers_and_refuse_what_the_wire_cannot_carry(fmt):
    """NumPy scalars encode as Python numbers do (the binary posterior header wrote
    ``"ts":np.float64(1.5)``, which no decoder reads); a seq outside [0, 2**63) or a
    non-finite ts is a ValueError (binary wrote them, and the decoder refused them)."""
    from streamfhmm.io.wire import encode_posterior_batch
    from streamfhmm.stream.engine import PosteriorBatch
    post = _post(M=2, D=3)
    batch = PosteriorBatch(np.array([post.t]), post.theta[None], post.rho[None], post.mean[None],
                           np.array([post.version]), np.array([post.flags]))
    for seq, ts in ((np.int64(7), np.float64(1.5)), (np.uint64(7), np.float32(1.5)), (7, np.int64(3))):
        s = decode_input(encode_sample(b"s", seq, ts, [1.0], format=fmt), 1)
        assert (s.seq, s.ts) == (7, float(ts))
        for frames in (encode_posterior(b"s", seq, ts, post, format=fmt),
                       encode_posterior_batch(b"s", np.array([seq]), np.array([ts]), batch, format=fmt)[0]):
            m = decode_output(frames)
            assert (m.seq, m.ts, m.t) == (7, float(ts), post.t)
    bad = [(-1, 0.0, "seq must be an integer in [0, 2**63), got -1"),
           (2**63, 0.0, "seq must be an integer in [0, 2**63), got 9223372036854775808"),
           (1.0, 0.0, "seq must be an integer in [0, 2**63), got 1.0"),
           (True, 0.0, "seq must be an integer in [0, 2**63), got True"),
           (0, float("nan"), "ts must be a finite number, got nan"),
           (0, np.inf, "ts must be a finite number, got inf"),
           (0, "1.5", "ts must be a finite number, got '1.5'")]
    for seq, ts, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)):
            encode_sample(b"s", seq, ts, [1.0], format=fmt)
        with pytest.raises(ValueError, match=re.escape(message)):
            encode_posterior(b"s", seq, ts, post, format=fmt)
    for seqs, tss, message in (([-1], [0.0], "seqs must be integers in [0, 2**63)"),
                               ([1.5], [0.0], "seqs must be integers in [0, 2**63)"),
                               ([0], [np.nan], "tss must be finite numbers"),
                               ([0, 1], [0.0, 1.0], "seqs and tss must have shape (1,)")):
        with pytest.raises(ValueError, match=re.escape(message)):
            encode_posterior_batch(b"s", seqs, tss, batch, format=fmt)


# -- malformed messages: each gives its own kind -------------------------------------------
GOOD_HEADER = b'{"seq":1,"ts":0.5}'
GOOD_PAYLOAD = np.array([1.0, 2.0, 3.0]).tobytes()

MALFORMED = [
    # (id, frames, kind, message fragment)
    ("no frames", [], "frames", "0 frames"),
    ("two frames", [b"t", GOOD_HEADER], "frames", "2 frames"),
    ("four frames", [b"t", GOOD_HEADER, GOOD_PAYLOAD, b""], "frames", "4 frames"),
    ("long topic", [b"t" * (MAX_TOPIC_BYTES + 1), GOOD_HEADER, GOOD_PAYLOAD], "topic", "256 bytes"),
    ("topic not utf-8", [b"\xc3\x28", GOOD_HEADER, GOOD_PAYLOAD], "topic", "not UTF-8"),
    ("header not json", [b"t", b"{seq:1}", GOOD_PAYLOAD], "json", "not valid JSON"),
    ("header not utf-8", [b"t", b'{"seq":1,"ts":"\xff"}', GOOD_PAYLOAD], "json", "not valid JSON"),
    ("header too long", [b"t", b'{"seq":1,"ts":0,"x":"' + b"a" * MAX_HEADER_BYTES + b'"}', GOOD_PAYLOAD],
     "json", "at most 1024"),
    ("header a list", [b"t", b"[1,2]", GOOD_PAYLOAD], "fields", "JSON object"),
    ("no seq", [b"t", b'{"ts":0.5}', GOOD_PAYLOAD], "fields", '"seq"'),
    ("seq float", [b"t", b'{"seq":1.0,"ts":0.5}', GOOD_PAYLOAD], "fields", '"seq"'),
    ("seq negative", [b"t", b'{"seq":-1,"ts":0.5}', GOOD_PAYLOAD], "fields", '"seq"'),
    ("seq huge", [b"t", b'{"seq":9223372036854775808,"ts":0.5}', GOOD_PAYLOAD], "fields", '"seq"'),
    ("seq bool", [b"t", b'{"seq":true,"ts":0.5}', GOOD_PAYLOAD], "fields", '"seq"'),
    ("no ts", [b"t", b'{"seq":1}', GOOD_PAYLOAD], "fields", '"ts"'),
    ("ts string", [b"t", b'{"seq":1,"ts":"now"}', GOOD_PAYLOAD], "fields", '"ts"'),
    ("ts infinite", [b"t", b'{"seq":1,"ts":Infinity}', GOOD_PAYLOAD], "fields", 'finite "ts"'),
    ("payload short", [b"t", GOOD_HEADER, GOOD_PAYLOAD[:-8]], "size", "16 bytes; expected 24"),
    ("payload long", [b"t", GOOD_HEADER, GOOD_PAYLOAD + b"\0"], "size", "25 bytes; expected 24"),
    ("payload float32", [b"t", GOOD_HEADER, np.ones(3, np.float32).tobytes()], "size", "12 bytes"),
    ("payload inf", [b"t", GOOD_HEADER, np.array([1.0, np.inf, 3.0]).tobytes()], "nonfinite", "value 1 is inf"),
    ("payload -inf", [b"t", GOOD_HEADER, np.array([-np.inf, 0, 3.0]).tobytes()], "nonfinite", "value 0 is -inf"),
    ("empty payload not heartbeat", [b"t", GOOD_HEADER, b""], "fields", "heartbeat"),
    ("heartbeat bad end", [b"t", b'{"heartbeat":true,"seq":1,"ts":0,"end":1}', b""], "fields", '"end"'),
    ("json not json", [b'{"seq":1,"ts":0,"values":[1,2,3]'], "json", "not valid JSON"),
    ("json too long", [b'{"seq":1,"ts":0,"values":[1,2,3],"pad":"' + b" " * 3000 + b'"}'], "json", "at most"),
    ("json a number", [b"42"], "fields", "JSON object"),
    ("json topic not str", [b'{"topic":1,"seq":1,"ts":0,"values":[1,2,3]}'], "fields", '"topic"'),
    ("json values not list", [b'{"seq":1,"ts":0,"values":"1,2,3"}'], "fields", '"values"'),
    ("json values strings", [b'{"seq":1,"ts":0,"values":[1,"2",3]}'], "fields", "numbers or null"),
    ("json values bool", [b'{"seq":1,"ts":0,"values":[1,true,3]}'], "fields", "numbers or null"),
    ("json values short", [b'{"seq":1,"ts":0,"values":[1,2]}'], "size", "2 numbers; expected 3"),
    ("json values overflow", [b'{"seq":1,"ts":0,"values":[1,2,1' + b"0" * 400 + b']}'], "nonfinite",
     "overflows"),
    ("json values inf", [b'{"seq":1,"ts":0,"values":[1,Infinity,3]}'], "nonfinite", "value 1 is inf"),
    ("json no seq", [b'{"ts":0,"values":[1,2,3]}'], "fields", '"seq"'),
    ("json long topic", [b'{"topic":"' + b"x" * 300 + b'","seq":1,"ts":0,"values":[1,2,3]}'], "topic",
     "300 bytes"),
    ("json deeply nested", [b"[" * 1050 + b"]" * 1050], "json", "nested too deeply"),
]


@pytest.mark.parametrize("frames,kind,fragment", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_input(frames, kind, fragment):
    with pytest.raises(WireError, match=None) as info:
        decode_input(frames, n_features=3)
    assert info.value.kind == kind, str(info.value)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("fmt", ["binary", "json"])
def test_a_sample_with_every_value_missing_is_a_sample(fmt):
    """It was refused as malformed: its sequence number then counted as a gap, which
    ends the engine's sequence (the lag flushed, edge flags), where the engine imputes
    a sample without a value from its window."""
    frames = encode_sample(b"t", 7, 1.5, np.full(3, np.nan), format=fmt)
    s = decode_input(frames, n_features=3)
    assert (s.topic, s.seq, s.ts) == (b"t", 7, 1.5) and np.isnan(s.values).all()


def test_every_error_kind_is_exercised():
    assert {m[2] for m in MALFORMED} == set(ERROR_KINDS)


def test_decode_output_errors():
    with pytest.raises(WireError) as info:
        decode_output([b"a", b"b"])
    assert info.value.kind == "frames"
    with pytest.raises(WireError) as info:
        decode_output([b"t", b'{"seq":1,"t":0,"ts":0,"version":0,"flags":0,"n_chains":3}', b"\0" * 40])
    assert info.value.kind == "size"
    with pytest.raises(WireError) as info:
        decode_output([b"t", b'{"seq":1}', b"\0" * 40])
    assert info.value.kind == "fields"


BIG = "1" + "0" * 400  # a JSON integer: valid JSON, too large for a float


@pytest.mark.parametrize("frames", [
    [b"s", b'{"seq":0,"ts":%s}' % BIG.encode(), np.zeros(2).tobytes()],          # binary header
    [b'{"topic":"s","seq":0,"ts":%s,"values":[1.0,2.0]}' % BIG.encode()],         # one frame
    [b"s", b'{"heartbeat":true,"seq":0,"ts":%s}' % BIG.encode(), b""],             # heartbeat
])
def test_decode_input_refuses_huge_integer_ts(frames):
    """float() of a 400-digit int raises OverflowError, which once escaped the service."""
    with pytest.raises(WireError) as info:
        decode_input(frames, 2)
    assert info.value.kind == "fields" and "finite" in str(info.value)


@pytest.mark.parametrize("frames,kind", [
    ([b'{"topic":"\\ud800","seq":0,"t":0,"ts":0,"version":0,"flags":0,'
      b'"theta":[0.5],"rho":[0],"mean":[0]}'], "topic"),                               # lone surrogate
    ([b"t", b'{"seq":0,"t":0,"ts":%s,"version":0,"flags":0,"n_chains":1}' % BIG.encode(),
      np.zeros(3).tobytes()], "fields"),
    ([b'{"topic":"t","seq":0,"t":0,"ts":0,"version":0,"flags":0,"theta":[%s],"rho":[0],"mean":[0]}'
      % BIG.encode()], "fields"),
    ([b"t", b'{"seq":"x","t":"y","ts":1,"version":0,"flags":0,"n_chains":1}', np.zeros(3).tobytes()],
     "fields"),
    ([b"t", b'{"seq":0,"t":0,"ts":1,"version":null,"flags":0,"n_chains":1}', np.zeros(3).tobytes()],
     "fields"),
    ([b"", b'{"heartbeat":true,"streams":"x","ts":1}', b""], "fields"),
])
def test_decode_output_raises_wire_errors_only(frames, kind):
    """A consumer (the demo) catches WireError; nothing else may escape for bad bytes."""
    with pytest.raises(WireError) as info:
        decode_output(frames)
    assert info.value.kind == kind


@pytest.mark.parametrize("size", [MAX_HEADER_BYTES, MAX_HEADER_BYTES + 1, 2000])
def test_header_bound_holds_for_the_canonical_form(size):
    """The canonical header (decoded without json) obeys the header bound as any other form
    does: a 1025-byte '{"seq":1,"ts":1.000...}' was accepted, the same object with its
    keys swapped refused (found by the differential fuzzer)."""
    pad = b"0" * (size - len(b'{"seq":1,"ts":1.}'))
    outcomes = []
    for header in (b'{"seq":1,"ts":1.%s}' % pad, b'{"ts":1.%s,"seq":1}' % pad):
        assert len(header) == size
        try:
            s = decode_input([b"t", header, GOOD_PAYLOAD], 3)
            outcomes.append((s.seq, s.ts))
        except WireError as exc:
            outcomes.append((exc.kind, str(exc)))
    if size <= MAX_HEADER_BYTES:
        assert outcomes == [(1, 1.0), (1, 1.0)]
    else:
        assert outcomes[0] == outcomes[1] == ("json", f"header of {size} bytes (at most {MAX_HEADER_BYTES})")


def test_huge_seq_and_ts_precision_survive():
    ts = math.pi * 1e9
    s = decode_input(encode_sample(b"", 2**63 - 1, ts, [0.0]), 1)
    assert s.seq == 2**63 - 1 and s.ts == ts


@pytest.mark.parametrize("nonfinite", [False, True])
def test_json_posterior_batch_is_what_encode_posterior_writes(nonfinite):
    """The batch encoder's template writes byte for byte what json.dumps writes per posterior."""
    from streamfhmm.io.wire import encode_posterior_batch
    from streamfhmm.stream.engine import PosteriorBatch
    print(f"seed={SEED}")
    rng = np.random.default_rng(SEED)
    n, M, D = 40, 3, 4
    scale = 10.0 ** rng.integers(-300, 300, size=(n, 1))
    batch = PosteriorBatch(np.arange(n, dtype=np.int64) + 10**12, rng.uniform(size=(n, M)),
                           rng.normal(size=(n, M)) * scale, rng.normal(size=(n, D)) * scale,
                           rng.integers(0, 10**9, n), rng.integers(0, 8, n))
    batch.mean[0] = [0.0, -0.0, 1.0, 5e-324]
    if nonfinite:
        batch.rho[3, 1] = np.nan
        batch.mean[7, 0] = np.inf
    seqs = rng.integers(0, 2**62, n).tolist()
    tss = (rng.normal(size=n) * 1e9).tolist()
    for topic in (b"house/1", "\u00e9t\u00e9 \"q\" 50%d".encode()):
        got = encode_posterior_batch(topic, seqs, tss, batch, format="json")
        want = [encode_posterior(topic, seqs[k], tss[k], batch[k], format="json") for k in range(n)]
        assert got == want


# -- gaps a mutation run found (each test fails on its mutant) --------------------------------
def test_a_topic_of_the_most_bytes_allowed_travels():
    from streamfhmm.io.wire import check_topic
    topic = b"t" * MAX_TOPIC_BYTES
    assert check_topic(topic) == topic
    s = decode_input(encode_sample(topic, 1, 2.0, np.array([1.0])), n_features=1)
    assert s.topic == topic


def test_an_output_payload_without_the_mean_is_refused():
    header = b'{"seq":1,"t":0,"ts":1.0,"version":0,"flags":0,"n_chains":2}'
    payload = np.zeros(4, dtype="<f8").tobytes()          # θ (2) and ρ (2): no mean
    with pytest.raises(WireError) as e:
        decode_output([b"s", header, payload])
    assert e.value.kind == "size"


def test_batch_json_writes_a_non_finite_mean_as_null():
    from types import SimpleNamespace
    from streamfhmm.io.wire import encode_posterior_batch
    batch = SimpleNamespace(t=np.array([0, 1]), theta=np.full((2, 1), 0.5), rho=np.full((2, 1), 0.25),
                            mean=np.array([[1.0, np.nan], [2.0, 3.0]]),
                            version=np.array([0, 0]), flags=np.array([0, 0]))
    msgs = encode_posterior_batch(b"s", [0, 1], [1.0, 2.0], batch, format="json")
    assert json.loads(msgs[0][0])["mean"] == [1.0, None]
    assert json.loads(msgs[1][0])["mean"] == [2.0, 3.0]


def test_a_time_stamp_keeps_its_text_through_pickle_copy_and_the_batch_encoder():
    """TsText (the number text of a canonical header) could not be pickled or copied
    (they rebuilt it from the float: TypeError), nor could a decoded Sample holding one;
    the Python batch encoder wrote repr of its float where a posterior published alone
    repeats the text."""
    import copy
    import pickle
    sample = decode_input([b"s", b'{"seq":3,"ts":1e3}', np.zeros(2).tobytes()], 2)
    assert sample.ts == 1000.0 and sample.ts.text == b"1e3"
    for twin in (copy.copy(sample.ts), copy.deepcopy(sample.ts), pickle.loads(pickle.dumps(sample.ts)),
                 pickle.loads(pickle.dumps(sample)).ts):
        assert twin == 1000.0 and twin.text == b"1e3"
    from streamfhmm.stream.engine import PosteriorBatch
    post = Posterior(t=4, theta=np.array([0.5]), rho=np.array([0.1]), mean=np.array([1.0, 2.0]),
                     version=2, flags=0)
    batch = PosteriorBatch.from_posteriors([post, post])
    for fmt in ("binary", "json"):
        frames = encode_posterior_batch(b"s", [7, 8], [TsText(b"1700000041"), 2.5], batch, fmt)
        heads = [f[1] if fmt == "binary" else f[0] for f in frames]
        assert [h.split(b'"ts":')[1].split(b",")[0] for h in heads] == [b"1700000041", b"2.5"]
        alone = encode_posterior(b"s", 7, TsText(b"1700000041"), post, fmt)
        assert alone == frames[0]
