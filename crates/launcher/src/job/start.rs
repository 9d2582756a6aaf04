//! Starting the top proxies: forked from rlaunch itself, spawned over a remote shell, or
//! left to dial in (see [`super::dial`]); and where each link's news goes.

use std::os::fd::AsRawFd;

use rlaunch_protocol::control::{NodePlan, Up};
use rlaunch_tree::children::{Children, Lost};
use rlaunch_tree::credit;
use rlaunch_tree::dialin::Dialed;
use rlaunch_tree::link::{self, LinkEvent};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::cause::Cause;
use super::{dial, Event, Plan, Root};
use crate::output::{Chunk, Feed, Spliced};

/// Forks the proxies of `roots` that run on this machine, now, with no exec (see
/// [`rlaunch_proxy::fork_proxy`]); the others are started by [`run`]. Must be called while rlaunch has
/// one thread: before the runtime, the writer and the stdin threads.
pub fn fork_local_proxies(plan: &mut Plan) {
    // Before the forks: their launches carry where orphans call (see `adopt`).
    super::adopt::prepare(plan);
    // The forked proxies keep none of rlaunch's sockets.
    let mut channels: Vec<i32> =
        plan.orphan_listener.iter().map(|(listener, _)| listener.as_raw_fd()).collect();
    // Nor the files rlaunch broadcasts: only rlaunch reads them.
    channels.extend(plan.bcast_files.iter().map(|f| f.file.as_raw_fd()));
    let lone = crate::output::lone_rank_stdout(&plan.output, plan.rank_node.len());
    // The plan's garbage is consolidated once here, not by each forked proxy in pages it
    // must first copy.
    // SAFETY: malloc_trim only rearranges this process's own heap.
    unsafe { nix::libc::malloc_trim(0) };
    plan.forked = plan
        .roots
        .iter()
        .map(|node| {
            node.fork.then(|| {
                let stdout = lone && node.ranks.len() == 1;
                // SAFETY: rlaunch has a single thread until `run`, as main guarantees.
                let forked = unsafe {
                    rlaunch_proxy::fork_proxy(
                        &plan.proxy_exe,
                        &channels,
                        &plan.job,
                        node,
                        stdout,
                        true,
                    )
                };
                if let Ok(proxy) = &forked {
                    channels.push(proxy.channel.as_raw_fd());
                }
                forked
            })
        })
        .collect();
}

impl Root {
    /// Starts the top proxies, as the world starts them, their links delivering to `events` and
    /// `output`; a scheduler's launcher, if the plan has one, with proxies dialing back.
    pub(super) fn start_proxies(
        &mut self,
        events: &mpsc::UnboundedSender<Event>,
        output: &Feed,
        dialed: mpsc::UnboundedSender<Dialed>,
    ) {
        self.links = Some((events.clone(), output.clone()));
        let splicer = output.splicer();
        self.listen_for_orphans();
        let (report, attempt) = (self.plan.report_bindings, self.policy.attempt());
        let (children, lost) = Children::start(
            &self.plan.job,
            &self.plan.roots,
            true,
            credit::ROOT_BUDGET,
            |index, node| {
                let process = self.proxies.top(index, node)?;
                Ok(match &splicer {
                    Some(splicer) => process.map(|p| splicer.attach(p)),
                    None => process,
                })
            },
            |child| {
                let (output, events) = (output.clone(), events.clone());
                move |event| route(child, attempt, event, output.clone(), events.clone(), report)
            },
        );
        self.children = children;
        self.bcast_begin();
        for Lost { host, reason, came_up } in lost {
            self.fail(Cause::LostProxy { host, reason, came_up });
        }
        if let Some(dial_plan) = &self.plan.dial {
            self.dial_tree = dial::DialTree::new(&self.plan.roots);
            let all: Vec<&NodePlan> = self.plan.roots.iter().flat_map(|r| r.walk()).collect();
            let hosts: Vec<&str> = all.iter().map(|n| n.host.as_str()).collect();
            let name = dial_plan.launcher.first().cloned().unwrap_or_default();
            match self.proxies.dial(dial_plan, &hosts, dialed) {
                Ok(started) => {
                    let launcher =
                        dial::Launcher { pid: started.pid, name, ended: None, late: None };
                    self.launchers.push(launcher);
                    let (acceptor, back) = (started.acceptor, started.back);
                    self.listening = Some(dial::Listening { acceptor, back });
                    self.dial_deadline = Some(Instant::now() + link::HELLO_WAIT);
                }
                Err(e) => {
                    let why = format!("cannot start {name}: {}", crate::quote::io_error(&e));
                    self.give_up_dialing(&why, |_, late| !late);
                }
            }
        }
    }
}

/// Output goes to the writer thread (its link's window bounds it: that is the backpressure),
/// everything else to the root, marked with the attempt (`--max-restarts`) the link is of. With `report_bindings`, the
/// root gets each RankStarted too: it knows every rank's name and host, spawned ones included.
pub(super) async fn route(
    child: usize,
    attempt: u32,
    event: LinkEvent,
    output: Feed,
    events: mpsc::UnboundedSender<Event>,
    report_bindings: bool,
) -> bool {
    match event {
        LinkEvent::Output { rank, stream, data, debt } => {
            output.send(Chunk::Data { rank, stream, data, debt })
        }
        LinkEvent::Spliced { output: spliced, debt } => {
            // Only rlaunch's own splicing (output::splice) takes output on its links.
            let spliced = spliced.downcast::<Spliced>().expect("output spliced by rlaunch");
            // All of it already in the sink: its room goes back now.
            !spliced.for_writer() || output.send(Chunk::Spliced { output: *spliced, debt })
        }
        LinkEvent::Up(Up::RankStarted { rank, pid, cpus, gpus }) => {
            if report_bindings {
                let up = Up::RankStarted { rank, pid, cpus, gpus };
                let _ = events.send(Event { child, attempt, event: LinkEvent::Up(up) });
            }
            !output.wants_starts() || output.send(Chunk::Started { rank, pid })
        }
        LinkEvent::Up(Up::OutputEnd { rank, stream }) => output.send(Chunk::End { rank, stream }),
        event => events.send(Event { child, attempt, event }).is_ok(),
    }
}
