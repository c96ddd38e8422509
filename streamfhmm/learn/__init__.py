"""Learning algorithms: the stochastic variational learner (``svi``), structured
mean-field EM (``smf``), exact EM (``em``) and the Dask data-parallel learner
(``distributed``)."""
