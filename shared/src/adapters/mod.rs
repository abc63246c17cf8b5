//! Adapters: the ports implemented on real infrastructure.

pub mod local;
