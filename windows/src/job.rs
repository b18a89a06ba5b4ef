//! A run's processes in one Job Object.
//!
//! [`Job::new`] makes the job with the run's [`JobLimits`]: kill every
//! process when the job's last handle closes, no breaking away, the
//! process count, memory per process and for the whole job, user-mode CPU
//! time per process, and the user-interface restrictions. [`Job::spawn`]
//! creates the command suspended, assigns it to the job and only then
//! resumes it, so its first instruction already runs inside the job, and
//! every process it creates is in the job too (not what it asks another
//! service to start). [`Job::supervise`] streams its output within a
//! quota, ends the run at its deadline or when asked, and ends every
//! process of the job when the command exits; [`Job::accounting`] reads
//! what the job measured.

use palisade_policy::windows::{CommandError, JobLimits, check_program, command_line, environment_block};
use std::ffi::c_void;
use std::io::{self, Read};
use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use windows_sys::Win32::Foundation::{
    HANDLE, HANDLE_FLAG_INHERIT, SetHandleInformation, WAIT_OBJECT_0, WAIT_TIMEOUT,
};
use windows_sys::Win32::Security::SECURITY_ATTRIBUTES;
use windows_sys::Win32::System::IO::CancelSynchronousIo;
use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, IsProcessInJob, JOB_OBJECT_LIMIT_ACTIVE_PROCESS,
    JOB_OBJECT_LIMIT_BREAKAWAY_OK, JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION, JOB_OBJECT_LIMIT_JOB_MEMORY,
    JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE, JOB_OBJECT_LIMIT_PROCESS_MEMORY, JOB_OBJECT_LIMIT_PROCESS_TIME,
    JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK, JOB_OBJECT_UILIMIT_DESKTOP, JOB_OBJECT_UILIMIT_DISPLAYSETTINGS,
    JOB_OBJECT_UILIMIT_EXITWINDOWS, JOB_OBJECT_UILIMIT_GLOBALATOMS, JOB_OBJECT_UILIMIT_HANDLES,
    JOB_OBJECT_UILIMIT_READCLIPBOARD, JOB_OBJECT_UILIMIT_SYSTEMPARAMETERS, JOB_OBJECT_UILIMIT_WRITECLIPBOARD,
    JOBOBJECT_BASIC_ACCOUNTING_INFORMATION, JOBOBJECT_BASIC_UI_RESTRICTIONS,
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION, JOBOBJECTINFOCLASS, JobObjectBasicAccountingInformation,
    JobObjectBasicUIRestrictions, JobObjectExtendedLimitInformation, QueryInformationJobObject,
    SetInformationJobObject, TerminateJobObject,
};
use windows_sys::Win32::System::Pipes::CreatePipe;
use windows_sys::Win32::System::Threading::{
    CREATE_NO_WINDOW, CREATE_SUSPENDED, CREATE_UNICODE_ENVIRONMENT, CreateProcessW, DETACHED_PROCESS,
    DeleteProcThreadAttributeList, EXTENDED_STARTUPINFO_PRESENT, GetCurrentProcess, GetExitCodeProcess,
    InitializeProcThreadAttributeList, LPPROC_THREAD_ATTRIBUTE_LIST, PROC_THREAD_ATTRIBUTE_HANDLE_LIST,
    PROCESS_INFORMATION, ResumeThread, STARTF_USESTDHANDLES, STARTUPINFOEXW, STARTUPINFOW, TerminateProcess,
    UpdateProcThreadAttribute, WaitForSingleObject,
};

/// The exit code the job's processes get when palisade ends the run (the
/// deadline, the output quota, a cancellation, the command's exit).
pub const ENDED_BY_PALISADE: u32 = 0xC000_013A;

/// How often supervision looks at the command, the deadline and the
/// cancellation between chunks of output.
const POLL: Duration = Duration::from_millis(20);

/// How long the output of a run's ended processes is still read: what
/// they wrote is in the pipes' buffers, read in far less.
pub const DRAIN: Duration = Duration::from_secs(2);

/// The `JOB_OBJECT_UILIMIT_*` flags of `palisade_policy::windows::UI_RESTRICTIONS`.
const UI_LIMITS: u32 = JOB_OBJECT_UILIMIT_READCLIPBOARD
    | JOB_OBJECT_UILIMIT_WRITECLIPBOARD
    | JOB_OBJECT_UILIMIT_GLOBALATOMS
    | JOB_OBJECT_UILIMIT_HANDLES
    | JOB_OBJECT_UILIMIT_DESKTOP
    | JOB_OBJECT_UILIMIT_DISPLAYSETTINGS
    | JOB_OBJECT_UILIMIT_SYSTEMPARAMETERS
    | JOB_OBJECT_UILIMIT_EXITWINDOWS;

/// A Job Object holding one run's processes. Dropping it closes the job's
/// handle, which kills every process still in it.
pub struct Job {
    handle: OwnedHandle,
    /// Whether the command gets a console (of its own, windowless): only
    /// where the job has room for its console host beside the run's processes.
    console: bool,
}

/// The command of a run, as it is started.
pub struct Command<'a> {
    /// The program's full path (never searched for).
    pub program: &'a str,
    /// Every argument, `argv[0]` included.
    pub argv: &'a [String],
    /// The command's whole environment.
    pub env: &'a [(String, String)],
    pub cwd: &'a str,
}

/// A command started in a job: its process, and its output's pipes.
pub struct Child {
    process: OwnedHandle,
    pub pid: u32,
    pub stdout: std::fs::File,
    pub stderr: std::fs::File,
}

/// What ended a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The command exited with this code (its other processes were then ended).
    Exited(u32),
    /// The deadline passed.
    Deadline,
    /// The output passed its quota.
    OutputQuota,
    /// Cancelled (the client gone, a shutdown).
    Cancelled,
}

/// How a supervised run went.
#[derive(Debug)]
pub struct Outcome {
    pub ended: Ended,
    /// The output, at most the quota of it.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// A job's settings as the system reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InForce {
    pub limits: JobLimits,
    pub kill_on_close: bool,
    /// Whether a process that crashes ends at once (no error dialog waits).
    pub die_on_unhandled_exception: bool,
    /// Whether a process may leave the job (never, for a run's).
    pub breakaway: bool,
    /// Whether every restriction of `UI_RESTRICTIONS` is set; `None`: the
    /// system does not report them (Wine).
    pub ui_restricted: Option<bool>,
}

/// What the job measured of its processes. A figure the system did not
/// report (zero where a run cannot have used none) is `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accounting {
    /// The most memory the job's processes committed together.
    pub peak_job_memory: Option<u64>,
    /// The most memory one process committed.
    pub peak_process_memory: Option<u64>,
    /// User and kernel time of every process of the job.
    pub cpu: Option<Duration>,
    /// Processes the job ever held.
    pub processes: Option<u32>,
}

fn check(ok: i32, what: &str) -> io::Result<()> {
    if ok != 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    Err(io::Error::new(e.kind(), format!("{what}: {e}")))
}

fn wide(s: &str) -> Vec<u16> {
    s.encode_utf16().chain(std::iter::once(0)).collect()
}

fn raw(h: &OwnedHandle) -> HANDLE {
    h.as_raw_handle() as HANDLE
}

/// A structure the system reads or writes for one information class of a
/// job: implemented for those structures only, so that the size and the
/// class passed together always agree.
///
/// # Safety
///
/// `CLASS` names the information class whose structure is `Self`, a plain
/// C structure that any bytes the system writes leave valid.
unsafe trait JobInformation: Default {
    const CLASS: JOBOBJECTINFOCLASS;
}

// SAFETY: JobObjectExtendedLimitInformation's structure, plain integers.
unsafe impl JobInformation for JOBOBJECT_EXTENDED_LIMIT_INFORMATION {
    const CLASS: JOBOBJECTINFOCLASS = JobObjectExtendedLimitInformation;
}

// SAFETY: JobObjectBasicUIRestrictions's structure, one integer.
unsafe impl JobInformation for JOBOBJECT_BASIC_UI_RESTRICTIONS {
    const CLASS: JOBOBJECTINFOCLASS = JobObjectBasicUIRestrictions;
}

// SAFETY: JobObjectBasicAccountingInformation's structure, plain integers.
unsafe impl JobInformation for JOBOBJECT_BASIC_ACCOUNTING_INFORMATION {
    const CLASS: JOBOBJECTINFOCLASS = JobObjectBasicAccountingInformation;
}

fn set_information<T: JobInformation>(job: &OwnedHandle, info: &T, what: &str) -> io::Result<()> {
    let size = u32::try_from(std::mem::size_of::<T>()).expect("a job information structure is small");
    // SAFETY: `info` is a live `T` of `size` bytes, the structure
    // `T::CLASS` names (JobInformation); the system only reads it during the call.
    let ok = unsafe {
        SetInformationJobObject(raw(job), T::CLASS, std::ptr::from_ref(info).cast::<c_void>(), size)
    };
    check(ok, what)
}

fn query_information<T: JobInformation>(job: &OwnedHandle, what: &str) -> io::Result<T> {
    let mut info = T::default();
    let size = u32::try_from(std::mem::size_of::<T>()).expect("a job information structure is small");
    // SAFETY: `info` is a writable `T` of `size` bytes, the plain-data
    // structure `T::CLASS` names (JobInformation), which any bytes the
    // system writes leave valid; the returned length may be null.
    let ok = unsafe {
        QueryInformationJobObject(
            raw(job),
            T::CLASS,
            std::ptr::from_mut(&mut info).cast::<c_void>(),
            size,
            std::ptr::null_mut(),
        )
    };
    check(ok, what)?;
    Ok(info)
}

impl Job {
    /// A job with `limits`, killing its processes when it closes and
    /// letting none break away.
    pub fn new(limits: &JobLimits) -> io::Result<Job> {
        // SAFETY: no security attributes (the handle is not inherited) and no name.
        let h = unsafe { CreateJobObjectW(std::ptr::null(), std::ptr::null()) };
        if h.is_null() {
            return Err(io::Error::other(format!("CreateJobObjectW: {}", io::Error::last_os_error())));
        }
        // SAFETY: `h` is a handle just created and owned by nobody else.
        let handle = unsafe { OwnedHandle::from_raw_handle(h) };
        let mut info = JOBOBJECT_EXTENDED_LIMIT_INFORMATION::default();
        let basic = &mut info.BasicLimitInformation;
        // Neither BREAKAWAY_OK nor SILENT_BREAKAWAY_OK: no process leaves the job.
        basic.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
            | JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION
            | JOB_OBJECT_LIMIT_ACTIVE_PROCESS;
        // A job of more than one process counts one more: the console host
        // of the command's console (a job of one gets no console).
        let console = limits.active_processes > 1;
        basic.ActiveProcessLimit = limits.active_processes.max(1).saturating_add(u32::from(console));
        if let Some(cpu) = limits.process_cpu {
            basic.LimitFlags |= JOB_OBJECT_LIMIT_PROCESS_TIME;
            basic.PerProcessUserTimeLimit = i64::try_from(cpu.as_nanos() / 100).unwrap_or(i64::MAX);
        }
        if let Some(bytes) = limits.process_memory {
            basic.LimitFlags |= JOB_OBJECT_LIMIT_PROCESS_MEMORY;
            info.ProcessMemoryLimit = usize::try_from(bytes).unwrap_or(usize::MAX);
        }
        if let Some(bytes) = limits.job_memory {
            info.BasicLimitInformation.LimitFlags |= JOB_OBJECT_LIMIT_JOB_MEMORY;
            info.JobMemoryLimit = usize::try_from(bytes).unwrap_or(usize::MAX);
        }
        set_information(&handle, &info, "cannot set the job's limits")?;
        let ui = JOBOBJECT_BASIC_UI_RESTRICTIONS { UIRestrictionsClass: UI_LIMITS };
        set_information(&handle, &ui, "cannot restrict the job's user interface")?;
        Ok(Job { handle, console })
    }

    /// Starts `command` in the job: created suspended, assigned, then
    /// resumed. Its input is the null device; its output two pipes.
    pub fn spawn(&self, command: &Command<'_>) -> io::Result<Child> {
        check_program(command.program).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        if command.cwd.contains('\0') {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, CommandError::Nul(command.cwd.into())));
        }
        let (stdout, stdout_w) = pipe()?;
        let (stderr, stderr_w) = pipe()?;
        let null = std::fs::File::open("NUL")?;
        inheritable(null.as_raw_handle() as HANDLE)?;
        let (process, thread, pid) = create_suspended(
            command,
            [null.as_raw_handle() as HANDLE, raw(&stdout_w), raw(&stderr_w)],
            self.console,
        )?;
        // SAFETY: both handles are live; the process has not run an instruction yet.
        let assigned = unsafe { AssignProcessToJobObject(raw(&self.handle), raw(&process)) };
        if let Err(e) = check(assigned, "cannot put the command in its job") {
            // Never resumed: ended where it stands, outside palisade's job.
            // SAFETY: `process` is a live handle with terminate access.
            unsafe { TerminateProcess(raw(&process), ENDED_BY_PALISADE) };
            return Err(nested(e));
        }
        // SAFETY: `thread` is the suspended main thread of the process.
        if unsafe { ResumeThread(raw(&thread)) } == u32::MAX {
            let e = io::Error::last_os_error();
            self.terminate();
            return Err(io::Error::other(format!("cannot resume the command: {e}")));
        }
        drop((stdout_w, stderr_w, null));
        Ok(Child { process, pid, stdout: stdout.into(), stderr: stderr.into() })
    }

    /// Ends every process of the job.
    pub fn terminate(&self) {
        // SAFETY: the job handle is live; TerminateJobObject only ends the job's processes.
        unsafe { TerminateJobObject(raw(&self.handle), ENDED_BY_PALISADE) };
    }

    /// Streams `child`'s output, keeping at most `max_output` bytes of
    /// both, until the run is over: every process of the job is ended
    /// when the command exits, at `deadline`, past the quota, or once
    /// `cancel` is set, whether or not the output is still open. What the
    /// ended processes wrote is read for [`DRAIN`] at most: a pipe still
    /// open after that is held by a process outside the job, and its
    /// reader's read is cancelled. On an error the job's processes are ended too.
    pub fn supervise(
        &self,
        child: Child,
        deadline: Option<Duration>,
        max_output: u64,
        cancel: &AtomicBool,
    ) -> io::Result<Outcome> {
        let (tx, rx) = mpsc::sync_channel(16);
        let readers = [(0usize, child.stdout), (1, child.stderr)].map(|(which, file)| {
            let tx = tx.clone();
            std::thread::spawn(move || relay(which, file, &tx))
        });
        drop(tx);
        let mut out = [Vec::new(), Vec::new()];
        let ended = self.watch(&child.process, &rx, &mut out, (Instant::now(), deadline), max_output, cancel);
        if ended.is_err() {
            self.terminate();
        }
        // What the readers had read when the run was over is kept (within the quota).
        while let Ok((which, chunk)) = rx.try_recv() {
            keep(&mut out, which, &chunk, max_output);
        }
        drop(rx);
        for reader in readers {
            stop(reader);
        }
        let ended = match ended? {
            Some(e) => e,
            None => Ended::Exited(exit_code(&child.process)?),
        };
        let [stdout, stderr] = out;
        Ok(Outcome { ended, stdout, stderr })
    }

    /// [`Job::supervise`]'s loop: why palisade ended the run (`None`: the
    /// command exited, and the rest of the job was ended after it).
    fn watch(
        &self,
        process: &OwnedHandle,
        rx: &mpsc::Receiver<(usize, Vec<u8>)>,
        out: &mut [Vec<u8>; 2],
        (start, deadline): (Instant, Option<Duration>),
        max_output: u64,
        cancel: &AtomicBool,
    ) -> io::Result<Option<Ended>> {
        // Why palisade ended the run, and when the job's processes were ended.
        let (mut ended, mut over, mut open) = (None, None::<Instant>, true);
        loop {
            if open {
                match rx.recv_timeout(POLL) {
                    Ok((which, chunk)) => {
                        if keep(out, which, &chunk, max_output) && ended.is_none() && over.is_none() {
                            ended = Some(Ended::OutputQuota);
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
                }
            } else if over.is_some() {
                return Ok(ended);
            } else {
                wait_for(process, POLL)?;
            }
            if over.is_none() {
                // The command's exit comes first: once it has exited, the run is its.
                let exited = wait_for(process, Duration::ZERO)?;
                if !exited && ended.is_none() {
                    ended = why_end(start, deadline, cancel);
                }
                if exited || ended.is_some() {
                    // The command's own exit code was set before this; ending the job cannot change it.
                    self.terminate();
                    over = Some(Instant::now());
                }
            }
            if over.is_some_and(|t| t.elapsed() >= DRAIN) {
                return Ok(ended);
            }
        }
    }

    /// What the system holds the job to, read back from it (what an
    /// attestation may name): its limits, whether closing it kills its
    /// processes, whether a crash ends a process at once, whether any may
    /// break away, and its UI restrictions.
    pub fn in_force(&self) -> io::Result<InForce> {
        let info: JOBOBJECT_EXTENDED_LIMIT_INFORMATION =
            query_information(&self.handle, "cannot read the job's limits")?;
        let ui: Option<JOBOBJECT_BASIC_UI_RESTRICTIONS> = query_information(&self.handle, "").ok();
        let b = &info.BasicLimitInformation;
        let has = |flag: u32| b.LimitFlags & flag != 0;
        Ok(InForce {
            limits: JobLimits {
                active_processes: if has(JOB_OBJECT_LIMIT_ACTIVE_PROCESS) {
                    // Less the console host's room (see Job::new).
                    b.ActiveProcessLimit
                        .saturating_sub(u32::from(self.console && b.ActiveProcessLimit != u32::MAX))
                } else {
                    u32::MAX
                },
                process_memory: has(JOB_OBJECT_LIMIT_PROCESS_MEMORY)
                    .then_some(info.ProcessMemoryLimit as u64),
                job_memory: has(JOB_OBJECT_LIMIT_JOB_MEMORY).then_some(info.JobMemoryLimit as u64),
                process_cpu: has(JOB_OBJECT_LIMIT_PROCESS_TIME).then(|| {
                    Duration::from_nanos(
                        u64::try_from(b.PerProcessUserTimeLimit).unwrap_or(0).saturating_mul(100),
                    )
                }),
            },
            kill_on_close: has(JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE),
            die_on_unhandled_exception: has(JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION),
            breakaway: has(JOB_OBJECT_LIMIT_BREAKAWAY_OK) || has(JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK),
            ui_restricted: ui.map(|ui| ui.UIRestrictionsClass & UI_LIMITS == UI_LIMITS),
        })
    }

    /// What the job measured so far.
    pub fn accounting(&self) -> io::Result<Accounting> {
        let what = "cannot read the job's accounting";
        let basic: JOBOBJECT_BASIC_ACCOUNTING_INFORMATION = query_information(&self.handle, what)?;
        let limits: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = query_information(&self.handle, what)?;
        let ticks = u64::try_from(basic.TotalUserTime.saturating_add(basic.TotalKernelTime)).unwrap_or(0);
        let nonzero = |v: u64| (v != 0).then_some(v);
        Ok(Accounting {
            peak_job_memory: nonzero(limits.PeakJobMemoryUsed as u64),
            peak_process_memory: nonzero(limits.PeakProcessMemoryUsed as u64),
            cpu: nonzero(ticks).map(|t| Duration::from_nanos(t.saturating_mul(100))),
            processes: (basic.TotalProcesses != 0).then_some(basic.TotalProcesses),
        })
    }
}

/// Creates `command`'s process suspended, with `stdio` (input, output,
/// error) as its standard handles and the only handles it inherits (a
/// handle list: a pipe of another run being started at the same time is
/// not passed on; a process started another way, without a list, while
/// these are inheritable could take them, so runs start here only). Its
/// process, its main thread and its id.
fn create_suspended(
    command: &Command<'_>,
    stdio: [HANDLE; 3],
    console: bool,
) -> io::Result<(OwnedHandle, OwnedHandle, u32)> {
    let line = command_line(command.argv).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let env = environment_block(command.env).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut attributes = HandleList::new(&stdio)?;
    let si = STARTUPINFOEXW {
        StartupInfo: STARTUPINFOW {
            cb: u32::try_from(std::mem::size_of::<STARTUPINFOEXW>()).expect("STARTUPINFOEXW is small"),
            dwFlags: STARTF_USESTDHANDLES,
            hStdInput: stdio[0],
            hStdOutput: stdio[1],
            hStdError: stdio[2],
            ..Default::default()
        },
        lpAttributeList: attributes.list(),
    };
    let mut pi = PROCESS_INFORMATION::default();
    let (program, mut line, cwd) = (wide(command.program), wide(&line), wide(command.cwd));
    // A console of its own, without a window, which what it starts shares;
    // a job of one process gets none (its console host would count against
    // the limit): see Job::new.
    let console = if console { CREATE_NO_WINDOW } else { DETACHED_PROCESS };
    let flags = CREATE_SUSPENDED | CREATE_UNICODE_ENVIRONMENT | console | EXTENDED_STARTUPINFO_PRESENT;
    // `si` is a whole STARTUPINFOEXW: its attribute list lives in
    // `attributes`, and its handles (the caller's `stdio`) are open and
    // inheritable for the call.
    // SAFETY: the strings are NUL-terminated UTF-16 outliving the call,
    // `line` writable; `env` ends in two NULs; `si` (above) and `pi` live.
    let ok = unsafe {
        CreateProcessW(
            program.as_ptr(),
            line.as_mut_ptr(),
            std::ptr::null(),
            std::ptr::null(),
            1,
            flags,
            env.as_ptr().cast::<c_void>(),
            cwd.as_ptr(),
            std::ptr::from_ref(&si).cast::<STARTUPINFOW>(),
            &mut pi,
        )
    };
    check(ok, &format!("cannot start {}", command.program))?;
    // SAFETY: CreateProcessW succeeded: both handles are new and ours alone.
    let (process, thread) =
        unsafe { (OwnedHandle::from_raw_handle(pi.hProcess), OwnedHandle::from_raw_handle(pi.hThread)) };
    Ok((process, thread, pi.dwProcessId))
}

/// A process attribute list naming the only handles a new process inherits.
struct HandleList<'a> {
    /// The list's storage (pointer-aligned, as the system requires).
    buffer: Vec<usize>,
    /// The handles the list points at, which must outlive it.
    _handles: &'a [HANDLE],
}

impl<'a> HandleList<'a> {
    fn new(handles: &'a [HANDLE]) -> io::Result<HandleList<'a>> {
        let mut size = 0usize;
        // SAFETY: a null list asks only for the size one attribute needs;
        // this call fails by design (ERROR_INSUFFICIENT_BUFFER).
        unsafe { InitializeProcThreadAttributeList(std::ptr::null_mut(), 1, 0, &mut size) };
        let mut buffer = vec![0usize; size.div_ceil(std::mem::size_of::<usize>())];
        // SAFETY: `buffer` holds at least `size` writable bytes, pointer-aligned.
        let ok = unsafe { InitializeProcThreadAttributeList(buffer.as_mut_ptr().cast(), 1, 0, &mut size) };
        check(ok, "cannot make an attribute list")?;
        // Initialized: from here on, dropping the list deletes it.
        let mut list = HandleList { buffer, _handles: handles };
        // SAFETY: the list was initialized above; `handles` outlives it (the
        // borrow `_handles` holds) and is `size_of_val(handles)` bytes.
        let ok = unsafe {
            UpdateProcThreadAttribute(
                list.list(),
                0,
                PROC_THREAD_ATTRIBUTE_HANDLE_LIST as usize,
                handles.as_ptr().cast::<c_void>(),
                std::mem::size_of_val(handles),
                std::ptr::null_mut(),
                std::ptr::null(),
            )
        };
        check(ok, "cannot name the handles the command inherits")?;
        Ok(list)
    }

    fn list(&mut self) -> LPPROC_THREAD_ATTRIBUTE_LIST {
        self.buffer.as_mut_ptr().cast::<c_void>()
    }
}

impl Drop for HandleList<'_> {
    fn drop(&mut self) {
        // SAFETY: a HandleList exists only once its list is initialized.
        unsafe { DeleteProcThreadAttributeList(self.list()) };
    }
}

/// Why palisade ends the run now, if it does.
fn why_end(start: Instant, deadline: Option<Duration>, cancel: &AtomicBool) -> Option<Ended> {
    if cancel.load(Ordering::Relaxed) {
        Some(Ended::Cancelled)
    } else if deadline.is_some_and(|d| start.elapsed() >= d) {
        Some(Ended::Deadline)
    } else {
        None
    }
}

/// `e`, a failure to put the command in its job, with the likely reason
/// where palisade itself runs in a job: a job with UI restrictions cannot
/// be nested in another.
fn nested(e: io::Error) -> io::Error {
    let mut in_job = 0;
    // SAFETY: the pseudo-handle of this process, no job (any job), a writable BOOL.
    let known = unsafe { IsProcessInJob(GetCurrentProcess(), std::ptr::null_mut(), &mut in_job) } != 0;
    if !(known && in_job != 0) {
        return e;
    }
    io::Error::new(
        e.kind(),
        format!(
            "{e}: palisade itself runs in a job (a scheduled task's, a CI runner's, a terminal's), and a job \
             with UI restrictions cannot be nested in another; run palisaded outside any job (as a service)"
        ),
    )
}

/// Adds `chunk` to output `which` within `max_output` bytes of both;
/// whether some of it did not fit.
fn keep(out: &mut [Vec<u8>; 2], which: usize, chunk: &[u8], max_output: u64) -> bool {
    let total = (out[0].len() + out[1].len()) as u64;
    let room = usize::try_from(max_output.saturating_sub(total)).unwrap_or(usize::MAX);
    out[which].extend_from_slice(&chunk[..chunk.len().min(room)]);
    chunk.len() > room
}

/// Whether `process` exits within `wait`.
fn wait_for(process: &OwnedHandle, wait: Duration) -> io::Result<bool> {
    let ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX - 1);
    // SAFETY: a live process handle; the wait is bounded.
    match unsafe { WaitForSingleObject(raw(process), ms) } {
        WAIT_OBJECT_0 => Ok(true),
        WAIT_TIMEOUT => Ok(false),
        _ => Err(io::Error::other(format!("cannot wait for the command: {}", io::Error::last_os_error()))),
    }
}

/// The exit code of a process that has exited.
fn exit_code(process: &OwnedHandle) -> io::Result<u32> {
    let mut code = 0u32;
    // SAFETY: a live process handle and a writable u32.
    check(unsafe { GetExitCodeProcess(raw(process), &mut code) }, "cannot read the command's exit code")?;
    Ok(code)
}

/// Ends `reader`: a read still blocked (on a pipe a process outside the
/// job holds) is cancelled; a reader that does not end is left to end
/// with its pipe.
fn stop(reader: std::thread::JoinHandle<()>) {
    use std::os::windows::io::AsRawHandle as _;
    for _ in 0..50 {
        if reader.is_finished() {
            let _ = reader.join();
            return;
        }
        // SAFETY: the reader thread's live handle; only its pending synchronous I/O is cancelled.
        unsafe { CancelSynchronousIo(reader.as_raw_handle() as HANDLE) };
        std::thread::sleep(POLL);
    }
}

/// Sends what `file` gives, chunk by chunk, until it ends.
fn relay(which: usize, mut file: std::fs::File, tx: &mpsc::SyncSender<(usize, Vec<u8>)>) {
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n @ 1..) = file.read(&mut buf) {
        if tx.send((which, buf[..n].to_vec())).is_err() {
            return;
        }
    }
}

/// A pipe: its read end (kept by palisade, never inherited) and its write
/// end (inherited by the command).
fn pipe() -> io::Result<(OwnedHandle, OwnedHandle)> {
    let sa = SECURITY_ATTRIBUTES {
        nLength: u32::try_from(std::mem::size_of::<SECURITY_ATTRIBUTES>()).expect("small"),
        lpSecurityDescriptor: std::ptr::null_mut(),
        bInheritHandle: 1,
    };
    let (mut r, mut w): (HANDLE, HANDLE) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: `r` and `w` are writable; `sa` is live for the call.
    check(unsafe { CreatePipe(&mut r, &mut w, &sa, 0) }, "cannot create a pipe for the command's output")?;
    // SAFETY: CreatePipe succeeded: both handles are new and ours alone.
    let (r, w) = unsafe { (OwnedHandle::from_raw_handle(r), OwnedHandle::from_raw_handle(w)) };
    // SAFETY: `r` is a live handle; only its inherit flag changes.
    check(unsafe { SetHandleInformation(raw(&r), HANDLE_FLAG_INHERIT, 0) }, "cannot keep a pipe's end")?;
    Ok((r, w))
}

/// Marks `h` inherited by the processes palisade starts.
fn inheritable(h: HANDLE) -> io::Result<()> {
    // SAFETY: `h` is a live handle the caller owns; only its inherit flag changes.
    check(
        unsafe { SetHandleInformation(h, HANDLE_FLAG_INHERIT, HANDLE_FLAG_INHERIT) },
        "cannot pass the null device",
    )
}
