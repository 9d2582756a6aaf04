//! `rlaunch-proxy`: started by rlaunch or by a parent proxy, never by hand. Its stdin and
//! stdout are the control channel to its parent.

fn main() {
    // Open MPI's singleton start, in a rank served no PMIx (see `singleton`).
    let name = std::env::args_os().next().unwrap_or_default();
    if std::path::Path::new(&name).file_name() == Some(rlaunch_proxy::singleton::ORTED.as_ref()) {
        std::process::exit(rlaunch_proxy::singleton::trapped());
    }
    rlaunch_tree::tune_malloc();
    rlaunch_tree::procs::cloexec_inherited_fds();
    rlaunch_tree::init_logging();
    let me = std::env::current_exe().map_or_else(|_| "rlaunch-proxy".into(), Into::into);
    match rlaunch_proxy::Dial::from_env() {
        Ok(Some(dial)) => {
            // Started by a scheduler's launcher: stdio is not a channel, only a log.
            if let Err(e) = rlaunch_tree::null_stdin_stdout() {
                eprintln!("rlaunch-proxy: cannot point stdin and stdout at /dev/null: {e}");
            }
            std::process::exit(rlaunch_proxy::run_dialing(dial, me));
        }
        Ok(None) => {}
        Err(e) => {
            eprintln!("rlaunch-proxy: {e}");
            std::process::exit(1);
        }
    }
    let (input, output) = match rlaunch_proxy::take_stdio_channel() {
        Ok(fds) => fds,
        Err(e) => {
            eprintln!("rlaunch-proxy: cannot take the control channel from stdin/stdout: {e}");
            std::process::exit(1);
        }
    };
    std::process::exit(rlaunch_proxy::run(input, output, me, None));
}
