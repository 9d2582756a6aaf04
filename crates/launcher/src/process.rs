//! rlaunch's own process, set up once the command line is read and while rlaunch still has
//! one thread: the log level (which the proxies inherit) and the open-file limit.

/// Starts logging at `-v` (info) or `-vv` (debug) unless `RLAUNCH_LOG` says otherwise. Sets
/// `RLAUNCH_LOG`, so it must run before any thread exists; the proxies inherit it.
pub fn start_logging(verbose: u8) {
    if verbose > 0 && std::env::var_os("RLAUNCH_LOG").is_none() {
        let level = if verbose == 1 { "info" } else { "debug" };
        std::env::set_var("RLAUNCH_LOG", level);
    }
    rlaunch_tree::init_logging();
}

/// Raises the soft limit on open files to the hard limit: with an output file per rank,
/// a large job needs more than the usual 1024. The proxies rlaunch forks inherit it, and
/// need it too with many ranks on one node.
pub fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::debug!("cannot raise the open-file limit to {hard}: {e}");
            }
        }
        _ => {}
    }
}
