//! rollout actors (stub).
