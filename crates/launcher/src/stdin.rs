//! Reads rlaunch's stdin on a thread of its own (it may be a terminal, a file or a pipe:
//! blocking reads serve them all) and hands chunks to the root one at a time.

use std::io::Read;
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd;

use tokio::sync::mpsc;

const CHUNK: usize = 64 << 10;

/// `None` inside the channel means end of file.
pub type Chunks = mpsc::Receiver<Option<Vec<u8>>>;

/// Starts the reader, unless stdin is a terminal of which we are not the foreground: reading
/// it would stop rlaunch with SIGTTIN (`rlaunch ... &` in an interactive shell).
pub fn start() -> Option<Chunks> {
    if nix::unistd::isatty(0).unwrap_or(false) {
        let fg = nix::unistd::tcgetpgrp(std::io::stdin());
        if fg.ok() != Some(nix::unistd::getpgrp()) {
            return None;
        }
    }
    let (tx, rx) = mpsc::channel(1);
    std::thread::spawn(move || {
        // SAFETY: fd 0 stays open for the life of the process; ManuallyDrop never closes it.
        let mut input = ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(0) });
        let mut buf = vec![0u8; CHUNK];
        loop {
            match input.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx.blocking_send(Some(buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!("reading stdin failed: {e}");
                    break;
                }
            }
        }
        let _ = tx.blocking_send(None);
    });
    Some(rx)
}

/// The next chunk; `None` at end of file (and forever after).
pub async fn next(chunks: &mut Option<Chunks>) -> Option<Vec<u8>> {
    match chunks {
        Some(rx) => match rx.recv().await {
            Some(Some(data)) => Some(data),
            _ => {
                *chunks = None;
                None
            }
        },
        None => None,
    }
}
