//! The PMI wire protocols, with no I/O in the core: what a rank and its PMI server say.
//!
//! ```text
//!   rlaunch-proxy ──PMI-1 / PMI-2──► rank
//!                    (pmi1/, pmi2/)
//!                    └─ one Request / Reply for both (request.rs, reply.rs)
//! ```
//!
//! * [`pmi1`]: PMI-1 ("simple PMI") request lines, spawn blocks and Hydra's exact replies.
//! * [`pmi2`]: PMI-2 length-framed commands, typed requests and replies, and [`pmi2::detect`]
//!   to tell the two protocols apart on a rank's socket.
//! * [`request`]: what a rank asks, whichever protocol it speaks: both protocols' requests map
//!   to one [`request::Request`], which a server answers with a [`reply::Reply`].
//! * [`reply`]: that answer, worded in PMI-1 or PMI-2.
//! * [`services`]: the requests that go beyond the rank's node (spawn, the name service),
//!   which rlaunch's control protocol (rlaunch-protocol) carries to the root.
//! * [`client`]: a small blocking PMI-1/PMI-2 client for Rust rank programs (std only).
//!
//! Every decoder here checks before it parses: a strict prefix of a message is "incomplete",
//! garbage is an error, and nothing panics on any input.

pub mod client;
pub mod pmi1;
pub mod pmi2;
pub mod reply;
pub mod request;
pub mod services;
