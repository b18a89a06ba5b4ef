//! The job mechanics, each check making the attempt inside a job and,
//! where the check is of a limit, the same attempt outside one, which
//! succeeds. A Windows program (run under Wine in CI: `.ci/run`): it
//! starts itself as the confined command, the verb in `PALISADE_WINPROBE`.
//! The checks Wine cannot show are listed with the reason, and run only on
//! Windows itself.

#[cfg(not(windows))]
fn main() {
    println!("the job mechanics are checked by the Windows build of this program (under Wine in CI)");
}

#[cfg(windows)]
fn main() {
    if let Ok(verb) = std::env::var("PALISADE_WINPROBE") {
        probe::main(&verb);
        return;
    }
    checks::main();
}

/// What the confined command does, by verb.
#[cfg(windows)]
mod probe {
    use std::io::Write;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    fn child(verb: &str) -> Command {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.env("PALISADE_WINPROBE", verb).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        c
    }

    /// Hands a copy of its output to the process PALISADE_PARENT (outside
    /// the job), says the copy's number there, then exits with
    /// PALISADE_EXIT where it is set, or runs on.
    fn hand_out() {
        use windows_sys::Win32::Foundation::{CloseHandle, DUPLICATE_SAME_ACCESS, DuplicateHandle};
        use windows_sys::Win32::System::Console::{GetStdHandle, STD_OUTPUT_HANDLE};
        use windows_sys::Win32::System::Threading::{GetCurrentProcess, OpenProcess, PROCESS_DUP_HANDLE};
        let parent: u32 = std::env::var("PALISADE_PARENT").unwrap().parse().unwrap();
        let mut copy = std::ptr::null_mut();
        // SAFETY: plain calls; the parent's handle is closed, the copy is the parent's to close.
        unsafe {
            let p = OpenProcess(PROCESS_DUP_HANDLE, 0, parent);
            assert!(!p.is_null());
            let own = GetStdHandle(STD_OUTPUT_HANDLE);
            assert_ne!(
                DuplicateHandle(GetCurrentProcess(), own, p, &mut copy, 0, 0, DUPLICATE_SAME_ACCESS),
                0
            );
            CloseHandle(p);
        }
        let mut out = std::io::stdout();
        writeln!(out, "{}", copy as usize).unwrap();
        out.flush().unwrap();
        if let Ok(code) = std::env::var("PALISADE_EXIT") {
            std::process::exit(code.parse().unwrap());
        }
        std::thread::sleep(Duration::from_secs(120));
    }

    pub fn main(verb: &str) {
        let mut out = std::io::stdout();
        match verb {
            "echo" => {
                print!("to stdout");
                eprint!("to stderr");
                std::process::exit(7);
            }
            "sleep" => std::thread::sleep(Duration::from_secs(120)),
            // Starts one process; says whether it could.
            "spawn" => match child("sleep").spawn() {
                Ok(mut c) => {
                    println!("spawned");
                    let _ = c.kill();
                }
                Err(e) => println!("refused: {e}"),
            },
            // Starts a process asking it to leave the job.
            "breakaway" => {
                use std::os::windows::process::CommandExt;
                const CREATE_BREAKAWAY_FROM_JOB: u32 = 0x0100_0000;
                match child("sleep").creation_flags(CREATE_BREAKAWAY_FROM_JOB).spawn() {
                    Ok(mut c) => {
                        println!("spawned");
                        let _ = c.kill();
                    }
                    Err(e) => println!("refused: {e}"),
                }
            }
            // Starts a long-lived process, says its id, then waits ("stay") or exits ("leave").
            "stay" | "leave" => {
                // Never waited for: it is what the command leaves behind.
                #[allow(clippy::zombie_processes)]
                let c = child("sleep").spawn().unwrap();
                writeln!(out, "{}", c.id()).unwrap();
                out.flush().unwrap();
                if verb == "stay" {
                    std::thread::sleep(Duration::from_secs(120));
                }
            }
            // Commits 256 MiB, touching every page.
            "alloc" => {
                let mut v: Vec<u8> = Vec::new();
                match v.try_reserve_exact(256 << 20) {
                    Ok(()) => {
                        v.resize(256 << 20, 1);
                        println!("allocated {}", v.len());
                    }
                    Err(e) => println!("refused: {e}"),
                }
            }
            // Writes to the handle numbered PALISADE_HANDLE, as a process
            // that inherited it could.
            "write-handle" => {
                use std::os::windows::io::{FromRawHandle, RawHandle};
                let n: usize = std::env::var("PALISADE_HANDLE").unwrap().parse().unwrap();
                // SAFETY: a test's probe: the handle may not exist here (that is
                // the point); it is never closed (forgotten below).
                let mut f = unsafe { std::fs::File::from_raw_handle(n as RawHandle) };
                match f.write_all(b"leaked") {
                    Ok(()) => println!("wrote"),
                    Err(e) => println!("refused: {e}"),
                }
                std::mem::forget(f);
            }
            // Closes its output, then runs on.
            "close-and-stay" => {
                use windows_sys::Win32::Foundation::CloseHandle;
                use windows_sys::Win32::System::Console::{
                    GetStdHandle, STD_ERROR_HANDLE, STD_OUTPUT_HANDLE,
                };
                // SAFETY: the process's own standard handles, not used again.
                unsafe {
                    CloseHandle(GetStdHandle(STD_OUTPUT_HANDLE));
                    CloseHandle(GetStdHandle(STD_ERROR_HANDLE));
                }
                std::thread::sleep(Duration::from_secs(120));
            }
            "hand-out" => hand_out(),
            "flood" => loop {
                if out.write_all(&[b'x'; 8192]).is_err() {
                    return;
                }
            },
            "spin" => {
                let start = std::time::Instant::now();
                let mut x = 0u64;
                while start.elapsed() < Duration::from_millis(400) {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                println!("{x}");
            }
            other => panic!("no verb {other}"),
        }
    }
}

#[cfg(windows)]
mod checks {
    use palisade_policy::windows::JobLimits;
    use palisade_windows::job::{Child, Command, Ended, Job, Outcome};
    use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle};
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    const MIB: u64 = 1 << 20;

    fn limits(active_processes: u32) -> JobLimits {
        JobLimits { active_processes, process_memory: None, job_memory: None, process_cpu: None }
    }

    fn env(verb: &str) -> Vec<(String, String)> {
        let mut env = vec![("PALISADE_WINPROBE".to_string(), verb.to_string())];
        for name in ["SystemRoot", "WINEPREFIX", "PATH"] {
            if let Ok(v) = std::env::var(name) {
                env.push((name.to_string(), v));
            }
        }
        env
    }

    fn spawn(job: &Job, verb: &str) -> Child {
        spawn_with(job, verb, &[])
    }

    fn spawn_with(job: &Job, verb: &str, extra: &[(String, String)]) -> Child {
        let exe = std::env::current_exe().unwrap();
        let exe = exe.to_str().unwrap();
        let argv = [exe.to_string(), verb.to_string()];
        let mut env = env(verb);
        env.extend_from_slice(extra);
        job.spawn(&Command { program: exe, argv: &argv, env: &env, cwd: "C:\\" }).unwrap()
    }

    fn run(job: &Job, verb: &str, deadline: Duration, max_output: u64) -> Outcome {
        let child = spawn(job, verb);
        job.supervise(child, Some(deadline), max_output, &AtomicBool::new(false)).unwrap()
    }

    /// `child` supervised to its end within `deadline`, its output under 1 MiB.
    fn supervise(job: &Job, child: Child, deadline: Duration) -> Outcome {
        job.supervise(child, Some(deadline), 1 << 20, &AtomicBool::new(false)).unwrap()
    }

    /// Closes the copy of a command's output that its `hand-out` made in this process.
    fn close_copy(copy: usize) {
        // SAFETY: a handle the command made in this process, owned by nothing else and closed once here.
        drop(unsafe { OwnedHandle::from_raw_handle(copy as *mut std::ffi::c_void) });
    }

    fn text(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }

    /// The first line the verb prints when run outside any job, as std
    /// starts it (what it leaves running may hold its output open).
    fn outside(verb: &str) -> String {
        use std::io::BufRead;
        let mut c = std::process::Command::new(std::env::current_exe().unwrap())
            .env("PALISADE_WINPROBE", verb)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(c.stdout.take().unwrap()).read_line(&mut line).unwrap();
        c.wait().unwrap();
        line
    }

    /// Process `pid`, opened now (before its number could be reused) to
    /// be watched.
    fn watch(pid: u32) -> OwnedHandle {
        use windows_sys::Win32::System::Threading::{OpenProcess, PROCESS_SYNCHRONIZE, PROCESS_TERMINATE};
        // SAFETY: a plain call; the handle is owned below.
        let h = unsafe { OpenProcess(PROCESS_SYNCHRONIZE | PROCESS_TERMINATE, 0, pid) };
        assert!(!h.is_null(), "process {pid} is not there to watch");
        // SAFETY: a new handle, owned by nobody else.
        unsafe { OwnedHandle::from_raw_handle(h) }
    }

    /// Whether the watched process still runs (given a moment to be
    /// gone after being ended), and if so ends it.
    fn alive(process: &OwnedHandle) -> bool {
        use windows_sys::Win32::Foundation::WAIT_TIMEOUT;
        use windows_sys::Win32::System::Threading::{TerminateProcess, WaitForSingleObject};
        let h = process.as_raw_handle();
        // SAFETY: a live process handle; the wait is bounded.
        let running = unsafe { WaitForSingleObject(h, 2000) } == WAIT_TIMEOUT;
        if running {
            // SAFETY: a live process handle with terminate access.
            unsafe { TerminateProcess(h, 1) };
        }
        running
    }

    /// The number the command printed first (a process id, a handle's number).
    fn first_number<T: std::str::FromStr>(child: &mut Child) -> T {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(&mut child.stdout).read_line(&mut line).unwrap();
        line.trim().parse().unwrap_or_else(|_| panic!("no number in {line:?}"))
    }

    fn the_job_holds_the_limits_it_was_given() {
        let asked = JobLimits {
            active_processes: 3,
            process_memory: Some(96 * MIB),
            job_memory: Some(192 * MIB),
            process_cpu: Some(Duration::from_secs(30)),
        };
        let f = Job::new(&asked).unwrap().in_force().unwrap();
        assert_eq!(f.limits, asked);
        assert!(f.kill_on_close && f.die_on_unhandled_exception && !f.breakaway, "{f:?}");
        assert_eq!(f.ui_restricted, Some(true), "{f:?}");
        let unlimited = Job::new(&limits(1)).unwrap().in_force().unwrap().limits;
        assert_eq!(
            (unlimited.process_memory, unlimited.job_memory, unlimited.process_cpu),
            (None, None, None)
        );
    }

    fn the_command_inherits_only_its_own_handles() {
        use std::io::Read;
        use std::os::windows::io::{AsRawHandle, FromRawHandle};
        use windows_sys::Win32::Security::SECURITY_ATTRIBUTES;
        use windows_sys::Win32::System::Pipes::CreatePipe;
        let sa = SECURITY_ATTRIBUTES {
            nLength: std::mem::size_of::<SECURITY_ATTRIBUTES>() as u32,
            lpSecurityDescriptor: std::ptr::null_mut(),
            bInheritHandle: 1,
        };
        let (mut r, mut w) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: writable handle slots and live attributes; both ends are owned below.
        assert_ne!(unsafe { CreatePipe(&mut r, &mut w, &sa, 0) }, 0);
        // SAFETY: new handles, owned by nobody else.
        let (mut r, w) = unsafe { (std::fs::File::from_raw_handle(r), std::fs::File::from_raw_handle(w)) };
        let handle = [("PALISADE_HANDLE".to_string(), (w.as_raw_handle() as usize).to_string())];
        // An inheritable handle of the broker's, open while the command starts.
        let job = Job::new(&limits(4)).unwrap();
        let child = spawn_with(&job, "write-handle", &handle);
        let o = supervise(&job, child, Duration::from_secs(60));
        assert!(
            text(&o.stdout).starts_with("refused"),
            "the command wrote to the broker's handle: {}",
            text(&o.stdout)
        );
        // Outside, std passes every inheritable handle on.
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .env("PALISADE_WINPROBE", "write-handle")
            .env(&handle[0].0, &handle[0].1)
            .output()
            .unwrap();
        assert_eq!(text(&out.stdout).trim(), "wrote");
        drop(w);
        let mut got = String::new();
        r.read_to_string(&mut got).unwrap();
        assert_eq!(got, "leaked", "only the process outside a job wrote");
    }

    fn output_and_exit_code_pass_through() {
        let job = Job::new(&limits(4)).unwrap();
        let o = run(&job, "echo", Duration::from_secs(60), 1 << 20);
        assert_eq!(o.ended, Ended::Exited(7));
        assert_eq!((text(&o.stdout), text(&o.stderr)), ("to stdout".into(), "to stderr".into()));
    }

    fn one_process_cannot_start_another() {
        let job = Job::new(&limits(1)).unwrap();
        let o = run(&job, "spawn", Duration::from_secs(60), 1 << 20);
        assert!(text(&o.stdout).starts_with("refused:"), "inside a job of one process: {}", text(&o.stdout));
        let job = Job::new(&limits(2)).unwrap();
        let o = run(&job, "spawn", Duration::from_secs(60), 1 << 20);
        assert_eq!(text(&o.stdout).trim(), "spawned", "a job of two lets the command start one");
        assert_eq!(outside("spawn").trim(), "spawned");
    }

    fn closing_the_job_kills_what_it_holds() {
        let job = Job::new(&limits(4)).unwrap();
        let mut child = spawn(&job, "stay");
        let grandchild = watch(first_number(&mut child));
        let command = watch(child.pid);
        drop(job);
        assert!(!alive(&grandchild), "the command's child outlived its job's handle");
        assert!(!alive(&command), "the command outlived its job's handle");
    }

    fn the_commands_exit_ends_what_it_left_running() {
        let job = Job::new(&limits(4)).unwrap();
        let mut child = spawn(&job, "leave");
        let grandchild = watch(first_number(&mut child));
        let o = supervise(&job, child, Duration::from_secs(60));
        assert_eq!(o.ended, Ended::Exited(0));
        assert!(!alive(&grandchild), "a process the command left outlived the run");
        // Outside a job, what the command leaves keeps running.
        let left = watch(outside("leave").trim().parse().unwrap());
        assert!(alive(&left), "outside a job, the process left behind runs on");
    }

    fn the_deadline_ends_the_run() {
        let job = Job::new(&limits(4)).unwrap();
        let mut child = spawn(&job, "stay");
        let grandchild = watch(first_number(&mut child));
        let command = watch(child.pid);
        let o = supervise(&job, child, Duration::from_secs(1));
        assert_eq!(o.ended, Ended::Deadline);
        assert!(!alive(&command) && !alive(&grandchild), "the run outlived its deadline");
    }

    fn the_deadline_holds_a_command_that_closed_its_output() {
        let job = Job::new(&limits(4)).unwrap();
        let child = spawn(&job, "close-and-stay");
        let command = watch(child.pid);
        let o = supervise(&job, child, Duration::from_secs(1));
        assert_eq!(o.ended, Ended::Deadline);
        assert!(!alive(&command), "the command outlived its deadline");
    }

    fn the_run_ends_though_a_process_outside_the_job_holds_its_output() {
        let job = Job::new(&limits(4)).unwrap();
        let parent = [("PALISADE_PARENT".to_string(), std::process::id().to_string())];
        let child = spawn_with(&job, "hand-out", &parent);
        let o = supervise(&job, child, Duration::from_secs(1));
        assert_eq!(o.ended, Ended::Deadline);
        close_copy(text(&o.stdout).trim().parse().expect("the command said its copy's number"));
    }

    /// A command that has exited while a process outside its job holds
    /// its output: the run is its exit, though the output stays open past
    /// the deadline (which passes while the output is drained).
    fn an_exit_stays_an_exit_though_a_process_outside_holds_the_output() {
        use windows_sys::Win32::System::Threading::WaitForSingleObject;
        let job = Job::new(&limits(4)).unwrap();
        let extra = [
            ("PALISADE_PARENT".to_string(), std::process::id().to_string()),
            ("PALISADE_EXIT".to_string(), "3".to_string()),
        ];
        let mut child = spawn_with(&job, "hand-out", &extra);
        let copy: usize = first_number(&mut child);
        let command = watch(child.pid);
        // SAFETY: a live process handle; the wait is bounded.
        let waited = unsafe { WaitForSingleObject(command.as_raw_handle(), 60_000) };
        assert_eq!(waited, 0, "the command did not exit");
        let o = supervise(&job, child, Duration::from_millis(1));
        assert_eq!(o.ended, Ended::Exited(3));
        close_copy(copy);
    }

    fn programs_windows_would_misread_are_refused() {
        let job = Job::new(&limits(4)).unwrap();
        for program in ["cmd.exe", "C:\\build.bat", "C:\\build.bat\\."] {
            let argv = [program.to_string()];
            let e = job.spawn(&Command { program, argv: &argv, env: &[], cwd: "C:\\" }).err().expect(program);
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{program}: {e}");
        }
    }

    fn cancelling_ends_the_run() {
        let job = Job::new(&limits(4)).unwrap();
        let child = spawn(&job, "sleep");
        let command = watch(child.pid);
        let o = job.supervise(child, Some(Duration::from_secs(60)), 1 << 20, &AtomicBool::new(true)).unwrap();
        assert_eq!(o.ended, Ended::Cancelled);
        assert!(!alive(&command));
    }

    fn the_output_quota_ends_the_run() {
        let job = Job::new(&limits(4)).unwrap();
        let o = run(&job, "flood", Duration::from_secs(60), 64 * 1024);
        assert_eq!(o.ended, Ended::OutputQuota);
        assert_eq!(o.stdout.len(), 64 * 1024, "exactly the quota is kept");
    }

    fn no_process_breaks_away() {
        let job = Job::new(&limits(4)).unwrap();
        let o = run(&job, "breakaway", Duration::from_secs(60), 1 << 20);
        assert!(text(&o.stdout).starts_with("refused:"), "a process left the job: {}", text(&o.stdout));
        assert_eq!(outside("breakaway").trim(), "spawned", "outside a job the flag is no obstacle");
    }

    fn the_memory_limit_holds() {
        let mut l = limits(4);
        l.process_memory = Some(64 * MIB);
        let job = Job::new(&l).unwrap();
        let o = run(&job, "alloc", Duration::from_secs(60), 1 << 20);
        assert!(!text(&o.stdout).starts_with("allocated"), "256 MiB committed under 64: {}", text(&o.stdout));
        assert!(outside("alloc").starts_with("allocated"));
    }

    fn the_job_accounts_for_cpu_and_memory() {
        let job = Job::new(&limits(4)).unwrap();
        let o = run(&job, "spin", Duration::from_secs(60), 1 << 20);
        assert_eq!(o.ended, Ended::Exited(0));
        let a = job.accounting().unwrap();
        assert!(a.cpu.is_some_and(|c| c >= Duration::from_millis(100)), "{a:?}");
        assert!(a.peak_job_memory.is_some_and(|m| m > MIB), "{a:?}");
        assert!(a.processes.is_some_and(|n| n >= 1), "{a:?}");
    }

    const NO_PROCESS_LIMIT: &str = "Wine accepts a job's active process limit and does not enforce it";
    const NO_MEMORY_LIMIT: &str = "Wine accepts a job's memory limits and does not enforce them";
    const NO_READBACK: &str = "Wine reports a job's limits as none and its UI restrictions not at all";
    const NO_ACCOUNTING: &str = "Wine reports no CPU time and no peak memory for a job";

    /// A check: its name, itself, and why Wine cannot show it (if it cannot).
    type Check = (&'static str, fn(), Option<&'static str>);

    /// The checks, and those Wine cannot show, each with why.
    const CHECKS: [Check; 16] = [
        ("the_job_holds_the_limits_it_was_given", the_job_holds_the_limits_it_was_given, Some(NO_READBACK)),
        ("output_and_exit_code_pass_through", output_and_exit_code_pass_through, None),
        ("the_command_inherits_only_its_own_handles", the_command_inherits_only_its_own_handles, None),
        ("one_process_cannot_start_another", one_process_cannot_start_another, Some(NO_PROCESS_LIMIT)),
        ("closing_the_job_kills_what_it_holds", closing_the_job_kills_what_it_holds, None),
        ("the_commands_exit_ends_what_it_left_running", the_commands_exit_ends_what_it_left_running, None),
        ("the_deadline_ends_the_run", the_deadline_ends_the_run, None),
        (
            "the_deadline_holds_a_command_that_closed_its_output",
            the_deadline_holds_a_command_that_closed_its_output,
            None,
        ),
        (
            "the_run_ends_though_a_process_outside_the_job_holds_its_output",
            the_run_ends_though_a_process_outside_the_job_holds_its_output,
            None,
        ),
        (
            "an_exit_stays_an_exit_though_a_process_outside_holds_the_output",
            an_exit_stays_an_exit_though_a_process_outside_holds_the_output,
            None,
        ),
        ("programs_windows_would_misread_are_refused", programs_windows_would_misread_are_refused, None),
        ("cancelling_ends_the_run", cancelling_ends_the_run, None),
        ("the_output_quota_ends_the_run", the_output_quota_ends_the_run, None),
        ("no_process_breaks_away", no_process_breaks_away, None),
        ("the_memory_limit_holds", the_memory_limit_holds, Some(NO_MEMORY_LIMIT)),
        ("the_job_accounts_for_cpu_and_memory", the_job_accounts_for_cpu_and_memory, Some(NO_ACCOUNTING)),
    ];

    /// The release of Wine this runs under (its ntdll exports
    /// `wine_get_version`); `None` on Windows itself.
    fn under_wine() -> Option<String> {
        use windows_sys::Win32::System::LibraryLoader::{GetModuleHandleA, GetProcAddress};
        // SAFETY: NUL-terminated names; ntdll is loaded in every process.
        let version = unsafe {
            let ntdll = GetModuleHandleA(c"ntdll.dll".as_ptr().cast());
            if ntdll.is_null() {
                return None;
            }
            GetProcAddress(ntdll, c"wine_get_version".as_ptr().cast())?
        };
        // SAFETY: Wine's `const char *wine_get_version(void)`, returning a static string.
        let version: extern "C" fn() -> *const std::ffi::c_char = unsafe { std::mem::transmute(version) };
        // SAFETY: a NUL-terminated static string.
        Some(unsafe { std::ffi::CStr::from_ptr(version()) }.to_string_lossy().into_owned())
    }

    pub fn main() {
        let wine = under_wine();
        let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
        let (mut passed, mut not_run) = (0, 0);
        for (name, check, wine_cannot) in CHECKS {
            if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
                continue;
            }
            if let (Some(_), Some(why)) = (&wine, wine_cannot) {
                println!("not run under Wine: {name}: {why}");
                not_run += 1;
                continue;
            }
            check();
            println!("ok: {name}");
            passed += 1;
        }
        let under = wine.map(|v| format!(", under Wine {v}")).unwrap_or_default();
        println!("job mechanics: {passed} passed, {not_run} not run (Windows only){under}");
    }
}
