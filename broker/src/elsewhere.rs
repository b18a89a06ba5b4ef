//! What `palisaded` and `palisade` do on a system without palisade's jail:
//! refuse, with the reason, before anything runs. Linux has the jail
//! (namespaces, Landlock, seccomp) and macOS its own (Seatbelt, `mac/`); a
//! Windows one (Job Objects) is not built, so a run there is refused rather
//! than run unconfined.

/// The exit status of a refusal: palisade failed, not the command (as
/// `cli::EXIT_PALISADE` on Linux).
pub const EXIT_REFUSED: i32 = 125;

/// Why nothing runs on `os` (as `std::env::consts::OS` names it).
pub fn reason(os: &str) -> String {
    format!(
        "no sandbox on {os}: palisade confines commands with Linux's namespaces, Landlock and seccomp \
         or macOS's Seatbelt, and has no executor for {os} yet; runs are refused rather than run unconfined"
    )
}

/// Prints the refusal for `program` and returns the exit status.
pub fn refuse(program: &str) -> i32 {
    eprintln!("{program}: {}", reason(std::env::consts::OS));
    EXIT_REFUSED
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_reason_names_the_system_and_what_is_missing() {
        let r = super::reason("windows");
        assert!(r.starts_with("no sandbox on windows:"), "{r}");
        assert!(r.contains("refused rather than run unconfined"), "{r}");
    }
}
