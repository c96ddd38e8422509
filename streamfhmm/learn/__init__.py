"""Learning algorithms: SMF-EM and the stochastic variational learner."""
