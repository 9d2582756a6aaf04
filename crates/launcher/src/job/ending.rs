//! How the job ends: the first cause starts the teardown (SIGTERM, the kill grace, then
//! SIGKILL, with a deadline for the output a slow reader has not taken), and at the end one
//! line says why, with the exit status of [`crate::exit`].

use std::io;
use std::time::Duration;

use rlaunch_protocol::record;
use tokio::time::Instant;

use super::cause::Cause;
use super::report::{self, OutFile};
use super::roll::Roll;
use super::{timeline, Root, OUTPUT_GRACE};

/// What writes a file at the end of the job (`--report`, `--timeline`).
type WriteEnd = fn(
    &mut OutFile,
    &report::JobFacts,
    &Roll,
    &[rlaunch_protocol::record::NodeRecord],
) -> io::Result<()>;

impl Root {
    /// Records why the job must end; the first cause starts the teardown.
    pub(super) fn fail(&mut self, cause: Cause) {
        tracing::debug!(?cause, "job failing");
        // Whatever is said next is not about the launch.
        if let Some(progress) = self.progress.as_mut() {
            progress.clear();
        }
        let first = self.causes.is_empty();
        self.ending.send_replace(true);
        // A forwarded signal ends the job when the grace after it is over, or when every
        // rank has ended before that: the ranks have had their grace, and what is still
        // running is killed now.
        // Output that waits to be written is dropped at once when a signal to rlaunch ends
        // the job (the user wants it over), and only well after the grace otherwise, so that
        // a reader that keeps up gets every line the ranks wrote before their end. Either
        // way, once every rank has ended, a reader that keeps up gets it all.
        let (grace, output_wait) = match cause {
            Cause::Forwarded(_) => (Duration::ZERO, Duration::ZERO),
            _ => (self.kill_grace(), OUTPUT_GRACE),
        };
        let only_if_behind = !output_wait.is_zero() || self.roll.all_ended();
        self.causes.push(cause);
        if first {
            // Lookups waiting for a name will not see it now.
            let answers = self.names.give_up();
            self.name_answers(answers);
            // Proxies waiting to be sent to their parent will not be needed: closing their
            // connections ends them now, and srun with them.
            self.dial_tree.drop_waiting();
            self.terminate(grace, output_wait, only_if_behind);
        }
    }

    /// Has every proxy tear its subtree down, drops the output not written `output_wait`
    /// after the grace (what the links still bring is read and thrown away, so the proxies
    /// finish however slow the reader), and kills the proxies that are still there a while
    /// after the grace.
    pub(super) fn terminate(
        &mut self,
        grace: Duration,
        output_wait: Duration,
        only_if_behind: bool,
    ) {
        self.children.terminate(grace);
        let dropped = *self.drop_output.borrow();
        self.teardown.begin(Instant::now(), grace, output_wait, only_if_behind, dropped);
    }

    /// One of rlaunch's last lines on stderr, on a line of its own even when a rank's output
    /// there ended mid-line.
    fn say(&mut self, line: &str) {
        if std::mem::take(&mut self.output_mid_line) {
            eprintln!();
        }
        eprintln!("rlaunch: {line}");
    }

    /// Prints why the job failed (the first cause, then the table of the ranks that failed
    /// if more than one did), writes `--report`, and returns the exit status.
    pub(super) fn report(&mut self) -> i32 {
        if let Some(progress) = self.progress.as_mut() {
            progress.clear();
        }
        let listed = self.plan.print_all_exit_codes;
        if listed {
            for line in self.roll.all_outcomes() {
                self.say(&line);
            }
        }
        let (code, line) = match self.causes.first() {
            Some(cause) => (cause.exit_code(), cause.message(&self.roll, listed)),
            None => (0, None),
        };
        if let Some(line) = &line {
            self.say(line);
        }
        // Ranks that a signal to rlaunch ended did not fail: it was the user's wish.
        let wished = matches!(self.causes.first(), Some(Cause::Forwarded(_) | Cause::Interrupted));
        if !self.causes.is_empty() && !listed && !wished {
            for row in report::failure_table(&self.roll) {
                self.say(&row);
            }
        }
        let facts = report::JobFacts {
            command: &self.plan.command,
            jobid: &self.plan.job.jobid,
            started: self.plan.started_us,
            ended: record::now_us(),
            exit_code: code,
            cause: line,
            fences: self.fence.epoch() + self.pmix_fence.completed(),
            tracker: self.tracker_span,
            hang: self.hang.as_ref(),
        };
        let records = self.children.take_records();
        let roll = &self.roll;
        let writes: [(_, _, WriteEnd); 2] = [
            ("report", self.plan.report.take(), report::write),
            ("timeline", self.plan.timeline.take(), timeline::write),
        ];
        for (what, file, write) in writes {
            let Some(mut file) = file else { continue };
            if let Err(e) = write(&mut file, &facts, roll, &records) {
                let path = file.path.display();
                eprintln!(
                    "rlaunch: cannot write the {what} {path}: {}",
                    crate::quote::io_error(&e)
                );
            }
        }
        code
    }
}
