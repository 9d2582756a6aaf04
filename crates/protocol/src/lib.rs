//! rlaunch's own control protocol, with no I/O in the core.
//!
//! ```text
//!   rlaunch ──control frames──► rlaunch-proxy ──PMI-1 / PMI-2 (pmi-wire)──► rank
//!            (this crate)
//! ```
//!
//! * [`control`]: the typed, length-prefixed frames between a parent and a child proxy, in two
//!   layers: the link's own (hello, ping, credit, clock, redirect) and the job's, read only by
//!   the tree's endpoints; and what they carry: a node's plan, spawns, the name service.
//! * [`ids`]: exit outcomes and stream ids shared by both ends.
//! * [`record`]: the figures of a rank's and a node's run that travel with their ends.
//! * [`io`] (feature `tokio`): reading and writing frames on an async byte stream.
//!
//! Every decoder here checks before it parses: a strict prefix of a message is "incomplete",
//! garbage is an error, and nothing panics on any input.

pub mod control;
pub mod ids;
#[cfg(feature = "tokio")]
pub mod io;
pub mod record;
pub mod stacks;
pub mod survey;
