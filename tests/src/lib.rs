//! End-to-end and port contract tests for Baton; they live in `tests/tests/`.
