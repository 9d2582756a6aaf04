//! Wire formats of rlaunch, with no I/O in the core.
//!
//! ```text
//!   rlaunch ──control frames──► rlaunch-proxy ──PMI-1 / PMI-2──► rank
//!            (control.rs)                      (pmi1.rs, pmi2.rs)
//! ```
//!
//! * [`control`]: the typed, length-prefixed frames between a parent and a child proxy.
//! * [`ids`]: exit outcomes and stream ids shared by both ends.
//! * [`pmi1`]: PMI-1 ("simple PMI") request lines, spawn blocks and Hydra's exact replies.
//! * [`pmi2`]: PMI-2 length-framed commands, typed requests and replies, and [`pmi2::detect`]
//!   to tell the two protocols apart on a rank's socket.
//! * [`client`]: a small blocking PMI-1/PMI-2 client for Rust rank programs (std only).
//! * [`io`] (feature `tokio`): reading and writing frames on an async byte stream.
//!
//! Every decoder here checks before it parses: a strict prefix of a message is "incomplete",
//! garbage is an error, and nothing panics on any input.

pub mod client;
pub mod control;
pub mod ids;
#[cfg(feature = "tokio")]
pub mod io;
pub mod pmi1;
pub mod pmi2;
