//! Prints where this rank runs, from the variables rlaunch gives every rank.
//!
//! `rlaunch -n 4 target/*/release/hello`

fn main() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| "?".into());
    println!(
        "hello from rank {} of {} on {} (local rank {} of {}, pid {})",
        var("PMI_RANK"),
        var("PMI_SIZE"),
        var("MPIR_CVAR_CH3_INTERFACE_HOSTNAME"),
        var("MPI_LOCALRANKID"),
        var("MPI_LOCALNRANKS"),
        std::process::id()
    );
}
