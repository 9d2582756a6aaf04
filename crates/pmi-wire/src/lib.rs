//! Wire formats of rlaunch, with no I/O in the core.
//!
//! ```text
//!   rlaunch ──control frames──► rlaunch-proxy ──PMI-1 / PMI-2──► rank
//!            (control/)            │           (pmi1/, pmi2/)
//!                                  └─ one Request / Reply for both (request.rs, reply.rs)
//! ```
//!
//! * [`control`]: the typed, length-prefixed frames between a parent and a child proxy, and
//!   what they carry: a node's plan, spawns, the name service.
//! * [`ids`]: exit outcomes and stream ids shared by both ends.
//! * [`pmi1`]: PMI-1 ("simple PMI") request lines, spawn blocks and Hydra's exact replies.
//! * [`pmi2`]: PMI-2 length-framed commands, typed requests and replies, and [`pmi2::detect`]
//!   to tell the two protocols apart on a rank's socket.
//! * [`request`]: what a rank asks, whichever protocol it speaks: both protocols' requests map
//!   to one [`request::Request`], which a server answers with a [`reply::Reply`].
//! * [`reply`]: that answer, worded in PMI-1 or PMI-2.
//! * [`client`]: a small blocking PMI-1/PMI-2 client for Rust rank programs (std only).
//! * [`record`]: the figures of a rank's and a node's run that travel with their ends.
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
pub mod record;
pub mod reply;
pub mod request;
