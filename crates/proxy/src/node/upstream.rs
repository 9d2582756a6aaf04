//! This proxy's link to its parent, read: what the link's own messages act on (credit, clock
//! probes, a redirect), and the reader that hands the job's frames to the dispatcher. A
//! proxy that rlaunch adopts (`adoption`) reads its new link with a reader of its own.

use std::sync::Arc;

use rlaunch_protocol::control::{DownFrame, LinkDown, LinkUp};
use rlaunch_protocol::io::FrameReader;
use rlaunch_protocol::record;
use rlaunch_tree::credit::Window;
use rlaunch_tree::link::LinkRead;
use tokio::sync::mpsc;

use super::Event;

/// This proxy's end of its link to its parent: what the link's own messages act on.
pub(super) struct LinkEnd<'a> {
    pub(super) window: &'a Window,
    pub(super) link: &'a mpsc::UnboundedSender<LinkUp>,
    pub(super) probed: &'a tokio::sync::watch::Sender<u32>,
}

/// Where a reader of the link up hands what it reads: the dispatcher, with the link's
/// number (0 the first; each adoption's next), so that a link left behind is no news.
pub(super) struct UpReader {
    pub(super) link: u32,
    pub(super) events: mpsc::UnboundedSender<Event>,
}

impl LinkEnd<'_> {
    /// Acts on one of the link's own messages from the parent: credit goes to the window, a
    /// clock probe is answered at once (the dispatcher may be busy, and the probe's answer
    /// must be prompt to be worth anything). A redirect is the caller's.
    pub(super) fn take(&self, link: LinkDown) -> Option<String> {
        match link {
            LinkDown::Credit { bytes } => self.window.grant(bytes),
            LinkDown::ClockProbe { sent } => {
                let _ = self.link.send(LinkUp::ClockEcho { sent, at: record::now_us() });
                self.probed.send_modify(|n| *n += 1);
            }
            LinkDown::Ping => {}
            LinkDown::Redirect { to } => return Some(to),
        }
        None
    }
}

/// Hands every frame from the parent to the dispatcher, then how the connection ended;
/// credit goes straight to the window and a clock probe is answered at once (the dispatcher
/// may be busy, and the probe's answer must be prompt to be worth anything). Reads on after
/// the dispatcher is gone: the pump still needs credit to send the last output up.
pub(super) async fn read_upstream(
    mut reader: FrameReader<LinkRead>,
    window: Arc<Window>,
    link: mpsc::WeakUnboundedSender<LinkUp>,
    probed: Arc<tokio::sync::watch::Sender<u32>>,
    UpReader { link: number, events }: UpReader,
) {
    loop {
        let event = match reader.next::<DownFrame>().await {
            Ok(Some(DownFrame::Link(message))) => {
                if let LinkDown::Credit { bytes } = message {
                    window.grant(bytes);
                } else if message == LinkDown::Ping {
                    let _ = events.send(Event::Heard);
                } else if let Some(sender) = link.upgrade() {
                    let end = LinkEnd { window: &window, link: &sender, probed: &probed };
                    if let Some(to) = end.take(message) {
                        tracing::debug!(to, "a redirect after the launch is ignored");
                    }
                }
                continue;
            }
            Ok(Some(DownFrame::Job(down))) => Event::Down(down),
            Ok(None) => Event::UpstreamClosed(number, "its parent closed the connection".into()),
            Err(e) => Event::UpstreamClosed(number, e.to_string()),
        };
        let last = matches!(event, Event::UpstreamClosed(..));
        let _ = events.send(event);
        if last {
            return;
        }
    }
}
