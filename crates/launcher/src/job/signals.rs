//! The signals rlaunch catches and forwards to the ranks.

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};

pub(crate) struct ForwardedSignals {
    streams: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl ForwardedSignals {
    pub(crate) fn new() -> ForwardedSignals {
        let wanted = [
            Signal::SIGINT,
            Signal::SIGTERM,
            Signal::SIGHUP,
            Signal::SIGQUIT,
            Signal::SIGUSR1,
            Signal::SIGUSR2,
            Signal::SIGTSTP,
            Signal::SIGCONT,
        ];
        let streams = wanted
            .into_iter()
            .map(|s| (s, signal(SignalKind::from_raw(s as i32)).expect("signal handler")))
            .collect();
        ForwardedSignals { streams }
    }

    /// The next signal that arrived.
    pub(crate) async fn recv(&mut self) -> Signal {
        std::future::poll_fn(|cx| {
            for (sig, stream) in &mut self.streams {
                if stream.poll_recv(cx).is_ready() {
                    return std::task::Poll::Ready(*sig);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}
