//! The Root's deadlines: which it holds, the earliest of them (the one its loop waits on),
//! and what it does when one comes.

use nix::sys::signal::Signal;
use rlaunch_protocol::control::Down;
use rlaunch_tree::{link, procs};
use tokio::time::Instant;

use super::policy;
use super::teardown::OutputDue;
use super::{Root, OUTPUT_GRACE, PROXY_GRACE};

/// The Root's deadlines, every one waited on by one arm of its loop: the earliest is next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Deadline {
    /// A proxy started by a scheduler's launcher has not called back.
    Dial,
    /// The grace after a forwarded signal, with ranks' ends held, is over.
    Held,
    /// The progress line is due to be drawn again.
    Progress,
    /// A name lookup has waited long enough for its name to be published.
    Lookup,
    /// `--timeout`.
    Timeout,
    /// The proxies' answers for the hang report are late: it is made without them.
    Survey,
    /// `--stall-report`: time to look whether the job did anything since the last look.
    Stall,
    /// Output not written by now is dropped (or, the reader keeping up, looked at again).
    Output,
    /// A child's link ended and its process lingers.
    Linger,
    /// The proxies that have not finished are killed, the scheduler's launchers asked to
    /// end their steps.
    Proxy,
    /// The scheduler's launchers asked to end their steps and still there are killed.
    Launcher,
    /// The wait before the job starts again is over (`--restart-backoff`).
    Restart,
    /// Nodes below a lost one did not call to be adopted in time.
    Orphans,
}

impl Root {
    /// The earliest of the Root's deadlines, and which it is.
    pub(super) fn next_deadline(&self) -> Option<(Instant, Deadline)> {
        rlaunch_tree::earliest([
            (self.dial_deadline, Deadline::Dial),
            (self.policy.held_deadline(), Deadline::Held),
            (self.progress.as_ref().and_then(|p| p.deadline()), Deadline::Progress),
            (self.names.deadline(), Deadline::Lookup),
            (self.timeout_at, Deadline::Timeout),
            (self.survey.as_ref().map(|s| s.deadline), Deadline::Survey),
            (self.stall.as_ref().and_then(|s| s.next), Deadline::Stall),
            (self.teardown.output_deadline(), Deadline::Output),
            (self.children.linger_deadline(PROXY_GRACE), Deadline::Linger),
            (self.teardown.proxy_deadline(), Deadline::Proxy),
            (self.teardown.launcher_deadline(), Deadline::Launcher),
            (self.restart_at, Deadline::Restart),
            (self.orphans_deadline(), Deadline::Orphans),
        ])
    }

    /// Deadline `which` has come. `writer_behind`: the output writer holds more than it
    /// keeps up with.
    pub(super) fn on_deadline(&mut self, which: Deadline, writer_behind: bool) {
        match which {
            Deadline::Dial => {
                self.dial_deadline = None;
                let wait = link::HELLO_WAIT.as_secs();
                let why = format!("its proxy did not call back within {wait} s");
                self.give_up_dialing(&why, |_, _| true);
            }
            Deadline::Held => self.decide(policy::Event::GraceOver),
            Deadline::Orphans => self.orphans_late(),
            Deadline::Restart => {
                self.restart_at = None;
                self.decide(policy::Event::BackoffOver);
            }
            Deadline::Progress => {
                if let Some(progress) = self.progress.as_mut() {
                    progress.draw();
                }
            }
            Deadline::Lookup => {
                let answers = self.names.expire(Instant::now());
                self.name_answers(answers);
            }
            Deadline::Timeout => self.timed_out(),
            Deadline::Survey => self.survey_done(),
            Deadline::Stall => self.stall_check(),
            Deadline::Output => {
                let note = match self.teardown.output_due(Instant::now(), writer_behind) {
                    // The reader keeps up: what is still coming is on its way through the
                    // tree, and is written (until the proxies' own deadline).
                    OutputDue::Recheck => return,
                    OutputDue::Drop { note } => note,
                };
                // A slow reader must not hold the end up: what the links still bring is read
                // and thrown away, so the proxies finish.
                tracing::debug!("dropping the output not written yet");
                if note {
                    let secs = OUTPUT_GRACE.as_secs();
                    eprintln!(
                        "rlaunch: note: output the reader had not taken {secs} s after the kill \
                         grace was dropped"
                    );
                }
                self.drop_output.send_replace(true);
                self.children.broadcast(&Down::DropOutput);
            }
            Deadline::Linger => self.children.kill_lingering(PROXY_GRACE),
            Deadline::Proxy => {
                self.teardown.proxy_due(Instant::now());
                self.children.kill_unfinished();
                // srun's SIGKILL would leave its step running: a proxy that is stopped or
                // hung (lost, and no child of rlaunch's) with it, and its ranks. SIGTERM has
                // srun end the step, every task killed by slurmstepd.
                for launcher in self.launchers.iter().filter(|l| l.ended.is_none()) {
                    tracing::warn!(launcher = %launcher.name, "did not finish; ending its step");
                    procs::signal_pid(launcher.pid, Signal::SIGTERM);
                }
            }
            Deadline::Launcher => {
                self.teardown.launcher_due();
                for launcher in self.launchers.iter().filter(|l| l.ended.is_none()) {
                    tracing::warn!(launcher = %launcher.name, "did not end; killing it");
                    procs::signal_pid(launcher.pid, Signal::SIGKILL);
                }
            }
        }
    }
}
