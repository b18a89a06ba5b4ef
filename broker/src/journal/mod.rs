//! The broker's audit journal: one hash-chained JSON line per event
//! (requests, decisions, approvals, runs, the broker's start and stop),
//! appended by one writer thread that syncs each batch once (group commit),
//! in segments that several brokers of one user may share under a lock.
//! Every record has a bounded size, refusals are recorded one by one at a
//! rate per uid and counted past it, nothing new starts below a free-space
//! floor, and retention goes by age. `docs/journal.md` describes the format
//! and how to verify it.

pub mod attest;
pub mod bound;
pub mod crash;
pub mod events;
mod rate;
mod record;
mod retention;
mod segment;
mod store;
pub mod verify;
mod writer;

pub use record::{GENESIS, Record};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use store::{Settings, Store};
use writer::{Class, Pending, Reply};

/// Where a record landed: its sequence number and its hash (lowercase hex sha256).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    pub seq: u64,
    pub hash: String,
}

/// Why an event could not be recorded (it is not in the journal).
#[derive(Debug, Clone, thiserror::Error)]
pub enum JournalError {
    /// Writing or syncing failed (a full disk, an I/O error): the next append tries again.
    #[error("the audit journal cannot be written: {0}")]
    Io(String),
    /// What is on disk does not read as the journal.
    #[error("the audit journal is damaged: {0}")]
    Damaged(String),
    /// The journal's directory is not the broker's alone.
    #[error("the audit journal's directory is refused: {0}")]
    Setup(String),
    /// The writer thread is gone.
    #[error("the audit journal's writer has stopped")]
    Stopped,
    /// The journal's filesystem is below its free-space floor: nothing new
    /// starts until there is space again.
    #[error(
        "the audit journal's filesystem ({dir}) has {free} bytes free, below the journal's floor of \
         {floor} bytes ([journal] min_free_bytes): new runs are refused until there is space again"
    )]
    BelowFloor { dir: String, free: u64, floor: u64 },
}

impl JournalError {
    /// The rule a refusal for this error names: the floor's configuration key.
    pub fn rule(&self) -> Option<&'static str> {
        matches!(self, JournalError::BelowFloor { .. }).then_some("journal.min_free_bytes")
    }
}

/// One event; serialized as the record's fields, with `"event": "<snake_case variant name>"`.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The broker started serving (`pid`, as which uid, its version).
    BrokerStarted { pid: u32, uid: u32, version: String },
    /// The broker stopped serving.
    BrokerStopped { pid: u32 },
    /// Found at a daemon's start: the broker instance `lost` (a `broker`
    /// tag) had started serving, is gone, and never recorded its stop (it
    /// crashed or was killed).
    BrokerLost { lost: String },
    /// Found at a daemon's start: run `run_id` of the broker instance
    /// `lost`, which is gone, started and never finished: it ended with its
    /// broker (its writes are held as a change set when the store had them).
    RunLost { lost: String, run_id: u64 },
    /// `palisaded` was asked to read its configuration `path` again
    /// (SIGHUP) and could not: the running one stays in force, and `error`
    /// says why in the file's own words.
    ConfigReloadFailed { path: String, error: String },
    /// A request came in (the peer from SO_PEERCRED; the command as asked).
    RequestReceived {
        run_id: u64,
        uid: u32,
        gid: u32,
        pid: Option<i32>,
        tool: Option<String>,
        argv: Vec<String>,
        workspace: Option<String>,
    },
    /// A refused request, in bounded form: what the record of a refusal
    /// holds of the request is counts, sizes, sha256 and first bytes (see
    /// [`bound`]), so that a refusal costs the journal little whatever the
    /// request's size.
    #[serde(rename = "request_received")]
    RequestRefused(Box<events::RefusedRequest>),
    /// The policy's decision: `allow`, `deny` (with kind and rule) or `needs_approval`.
    Decision {
        run_id: u64,
        decision: String,
        kind: Option<String>,
        rule: Option<String>,
        reason: Option<String>,
    },
    /// A run was put to a person (the requester and/or the approvers).
    ApprovalAsked { approval: u64, run_id: u64, uid: u32, tool: Option<String>, reason: String },
    /// The answer: `by_uid` None when nobody answered (expired, client gone).
    ApprovalAnswered { approval: u64, run_id: u64, by_uid: Option<u32>, approved: bool, why: String },
    /// A tool moved between trust stages ("draft", "trial", "verified").
    TrustChanged {
        tool: String,
        from: String,
        to: String,
        reason: String,
        by_uid: Option<u32>,
        capabilities_sha256: String,
    },
    /// The sandbox is about to start: what the attestation will pin.
    RunStarted {
        run_id: u64,
        execution_sha256: String,
        tier: String,
        enforcement: Box<palisade_protocol::attest::Enforcement>,
    },
    /// The run ended: how, what it used, how much it wrote.
    RunFinished {
        run_id: u64,
        status: String,
        wall_ms: u64,
        cpu_user_ms: u64,
        cpu_system_ms: u64,
        peak_memory_bytes: u64,
        stdout_bytes: u64,
        stderr_bytes: u64,
        written_bytes: u64,
        /// The paths the run changed that the copy-back withheld, and why.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        withheld: Vec<palisade_protocol::wire::Withheld>,
        /// Strict egress: the hosts reached, the attempts refused, the bytes each way.
        #[serde(skip_serializing_if = "Option::is_none")]
        egress: Option<palisade_protocol::attest::EgressTraffic>,
    },
    /// A request on an inspected domain (strict egress with TLS
    /// termination): one record each, the first `EGRESS_LIST_MAX` of a
    /// run, before its `run_finished` (whose `egress.requests_omitted`
    /// counts the rest).
    InspectedRequest {
        run_id: u64,
        #[serde(flatten)]
        request: palisade_protocol::attest::InspectedRequest,
    },
    /// What became of a run's writes, or of a held change set: `outcome`
    /// `applied`, `held` or `discarded`; its paths (the first 256, and how
    /// many in all), those that conflicted with the host's, and the sha256
    /// of its entries (each file's sha256 among them).
    Changes {
        run_id: u64,
        id: Option<String>,
        outcome: String,
        reason: Option<String>,
        paths: Vec<String>,
        paths_total: u64,
        conflicts: Vec<String>,
        sha256: String,
    },
    /// The run could not be carried out (its error as the client gets it);
    /// `stage` and `errno` name the helper's failing step when it was one.
    RunFailed { run_id: u64, kind: String, message: String, stage: Option<String>, errno: Option<i32> },
    /// A plugin call came in and was decided (`decision`: `allow`, or
    /// `deny` with the refusal's kind): before the plugin runs.
    PluginCalled {
        call_id: u64,
        uid: u32,
        pid: Option<i32>,
        skill: String,
        inline: bool,
        module_sha256: Option<String>,
        decision: String,
        kind: Option<String>,
        reason: Option<String>,
    },
    /// A plugin call ended: `outcome` is `ok` or the error's kind.
    PluginFinished {
        call_id: u64,
        skill: String,
        outcome: String,
        message: Option<String>,
        fuel_used: u64,
        memory_peak_bytes: u64,
        host_calls: u64,
        host_calls_refused: u64,
        wall_ms: u64,
    },
    /// A torn last line (a writer killed mid-write) was moved into `file`.
    TailSetAside { file: String, bytes: u64, sha256: String },
    /// Retention removed these segments: records `first_seq..=last_seq`, the last hash `last_hash`.
    SegmentsRemoved { files: Vec<String>, first_seq: u64, last_seq: u64, last_hash: String },
    /// Refusals of `uid` past the rate, not recorded one by one: `count` of
    /// them in the period that started at `since` (`period_secs` long),
    /// after the `recorded` ones that were.
    RefusalsSummarized { uid: u32, count: u64, recorded: u32, since: String, period_secs: u64 },
    /// palisaded read its configuration again (`SIGHUP`) and decides every
    /// request from now on with it: the file, the sha256 of what was read,
    /// and the keys it changed that keep their running value until a restart.
    ConfigReloaded { path: String, sha256: String, needs_restart: Vec<String> },
}

/// An event's fields as a record carries them.
fn fields(event: &Event) -> Map<String, Value> {
    match serde_json::to_value(event) {
        Ok(Value::Object(map)) => map,
        // Every variant is a struct of strings, numbers and lists.
        _ => Map::new(),
    }
}

/// The journal's configuration, resolved.
#[derive(Debug, Clone)]
pub struct Options {
    pub dir: PathBuf,
    pub segment_bytes: u64,
    pub keep_days: Option<u32>,
    pub reader_gid: Option<u32>,
    pub min_free_bytes: u64,
    pub refusals_recorded: u32,
    pub refusal_period: std::time::Duration,
}

impl Options {
    /// From the `[journal]` table: `None` when the journal is off.
    pub fn from_config(whole: &palisade_policy::config::Config) -> Result<Option<Options>, String> {
        let config = &whole.journal;
        if !config.enabled {
            return Ok(None);
        }
        Ok(Some(Options {
            dir: default_dir(config.path.as_deref())?,
            segment_bytes: config.segment_bytes,
            keep_days: config.keep_days,
            reader_gid: whole
                .journal_reader_gid(&crate::host::accounts::Accounts)
                .map_err(|e| e.to_string())?,
            min_free_bytes: config.min_free_bytes,
            refusals_recorded: config.refusals_recorded,
            refusal_period: std::time::Duration::from_secs(config.refusal_period_secs),
        }))
    }
}

/// The variable naming the journal's directory when the configuration does not.
pub const JOURNAL_ENV: &str = "PALISADE_JOURNAL";

/// `configured`, else `$PALISADE_JOURNAL`, else `journal` in the state directory.
pub fn default_dir(configured: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = configured {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os(JOURNAL_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    Ok(crate::host::paths::default_state_dir()?.join("journal"))
}

/// The broker's audit journal; cheap to clone (an Arc inside).
#[derive(Clone, Default)]
pub struct Journal {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    queue: mpsc::Sender<Pending>,
    dir: PathBuf,
    /// The refusals recorded one by one, per uid (shared with the writer).
    rate: Arc<rate::RefusalRate>,
    /// The newest record this broker wrote (`palisade status`).
    head: std::sync::Mutex<Option<Receipt>>,
}

/// What became of a refused request's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalRecord {
    /// Written and synced (or the journal is off).
    Written,
    /// Past its uid's rate: counted, for the period's `refusals_summarized`.
    Counted,
}

impl Journal {
    /// A journal that records nothing (`[journal] enabled = false`).
    pub fn off() -> Journal {
        Journal { inner: None }
    }

    /// Opens the journal in `options.dir` and starts its writer thread.
    pub fn open(options: &Options) -> Result<Journal, JournalError> {
        let settings = Settings {
            segment_bytes: options.segment_bytes,
            keep_days: options.keep_days,
            reader_gid: options.reader_gid,
        };
        let store = Store::open(&options.dir, settings)?;
        let rate = Arc::new(rate::RefusalRate::new(options.refusals_recorded, options.refusal_period));
        let (queue, pending) = mpsc::channel();
        let writer = writer::Writer {
            store,
            rate: rate.clone(),
            min_free_bytes: options.min_free_bytes,
            below_floor: Default::default(),
        };
        std::thread::Builder::new()
            .name("palisade-journal".into())
            .spawn(move || writer.run(pending))
            .map_err(|e| JournalError::Io(format!("cannot start the writer thread: {e}")))?;
        let head = std::sync::Mutex::new(None);
        Ok(Journal { inner: Some(Arc::new(Inner { queue, dir: options.dir.clone(), rate, head })) })
    }

    /// The journal `[journal]` describes: opened, or off.
    pub fn from_config(config: &palisade_policy::config::Config) -> Result<Journal, String> {
        match Options::from_config(config)? {
            Some(options) => Journal::open(&options).map_err(|e| format!("{e} ({})", options.dir.display())),
            None => Ok(Journal::off()),
        }
    }

    /// Refuses a journal whose newest records do not chain: a broker does
    /// not write on one.
    pub fn check_newest(&self) -> Result<(), String> {
        let Some(dir) = self.dir() else { return Ok(()) };
        verify::verify_newest(dir).map_err(|broken| {
            format!("the audit journal {} is broken at {broken}; see `palisade audit verify`", dir.display())
        })
    }

    /// The newest record this broker wrote (its seq and hash); `None` with
    /// the journal off, or before the first record.
    pub fn head(&self) -> Option<Receipt> {
        self.inner.as_ref().and_then(|i| i.head.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Keeps the newest of `receipts` as the head, if it is newer.
    fn note_head(&self, receipts: &Result<Vec<Receipt>, JournalError>) {
        let (Some(inner), Ok(receipts)) = (&self.inner, receipts) else { return };
        let Some(newest) = receipts.iter().max_by_key(|r| r.seq) else { return };
        let mut head = inner.head.lock().unwrap_or_else(|e| e.into_inner());
        if head.as_ref().is_none_or(|h| h.seq < newest.seq) {
            *head = Some(newest.clone());
        }
    }

    /// Whether events are recorded.
    pub fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// The directory of the journal, when it is on.
    pub fn dir(&self) -> Option<&Path> {
        self.inner.as_ref().map(|i| i.dir.as_path())
    }

    /// Appends `event` and returns once it is on disk (fsync; concurrent appends may share one).
    /// An error means the event is NOT recorded: the caller refuses what it was about to do
    /// with `BrokerError::JournalUnavailable(message)` (kind `ErrorKind::JournalUnavailable`).
    /// With the journal off, nothing is written and the receipt is seq 0 with an empty hash.
    pub async fn append(&self, event: Event) -> Result<Receipt, JournalError> {
        last(self.append_all(vec![event], true).await)
    }

    /// The same, for code that may block (no runtime needed).
    pub fn append_blocking(&self, event: Event) -> Result<Receipt, JournalError> {
        last(self.append_all_blocking(vec![event], true))
    }

    /// Appends `events` together, in order: synced to disk before this
    /// returns when `durable`, else written (in the page cache, kept if the
    /// broker is killed) and synced with the next durable batch. Records of
    /// what is under way: written below the free-space floor too.
    pub async fn append_all(&self, events: Vec<Event>, durable: bool) -> Result<Vec<Receipt>, JournalError> {
        self.submit(events, durable, Class::Ongoing).await
    }

    /// Appends `events` together, in order, synced before this returns:
    /// the receipt of the last (as [`Journal::append`] answers).
    pub async fn append_many(&self, events: Vec<Event>) -> Result<Receipt, JournalError> {
        last(self.append_all(events, true).await)
    }

    /// [`Journal::append_all`] for code that may block.
    pub fn append_all_blocking(
        &self,
        events: Vec<Event>,
        durable: bool,
    ) -> Result<Vec<Receipt>, JournalError> {
        self.submit_blocking(events, durable, Class::Ongoing)
    }

    /// Appends the records that start a run (its request, its decision,
    /// its start): as [`Journal::append_all`], but refused
    /// ([`JournalError::BelowFloor`]) when the journal's filesystem is below
    /// `min_free_bytes`, so the runs under way keep the room to end. The
    /// records go to the writer when this is called, not when the future is
    /// first polled: the caller may build the run's sandbox while they sync.
    pub fn start_all(
        &self,
        events: Vec<Event>,
        durable: bool,
    ) -> impl Future<Output = Result<Vec<Receipt>, JournalError>> + Send + '_ {
        self.submit(events, durable, Class::Start)
    }

    /// [`Journal::start_all`] for code that may block.
    pub fn start_all_blocking(
        &self,
        events: Vec<Event>,
        durable: bool,
    ) -> Result<Vec<Receipt>, JournalError> {
        self.submit_blocking(events, durable, Class::Start)
    }

    /// Records a refused request of `uid` (its bounded request and its
    /// decision), synced before this returns; refused below the floor as a
    /// run's start is. Past the uid's rate (`refusals_recorded` a period),
    /// nothing is written: the refusal is counted for the period's
    /// `refusals_summarized` record.
    pub fn refusal_blocking(&self, uid: u32, events: Vec<Event>) -> Result<RefusalRecord, JournalError> {
        let Some(inner) = &self.inner else { return Ok(RefusalRecord::Written) };
        match inner.rate.note(uid, std::time::Instant::now(), std::time::SystemTime::now()) {
            rate::Admit::Record => {
                self.submit_blocking(events, true, Class::Refusal)?;
                Ok(RefusalRecord::Written)
            }
            rate::Admit::Count { first } => {
                if first {
                    // The writer learns when this period ends, to write its summary then.
                    inner.queue.send(Pending::wake()).map_err(|_| JournalError::Stopped)?;
                }
                Ok(RefusalRecord::Counted)
            }
        }
    }

    /// Appends the broker's last record (`broker_stopped`), after a
    /// `refusals_summarized` record of every refusal still counted, and logs
    /// the journal's head (seq and hash), to be kept where the journal is
    /// not (see `docs/journal.md`).
    pub async fn append_last(&self, event: Event) -> Result<Receipt, JournalError> {
        let receipt = last(self.submit(vec![event], true, Class::Last).await)?;
        if self.enabled() {
            tracing::info!("journal head {} {} (the broker stops)", receipt.seq, receipt.hash);
        }
        Ok(receipt)
    }

    /// Queues an append now; the future waits for the writer's answer.
    fn submit(
        &self,
        events: Vec<Event>,
        durable: bool,
        class: Class,
    ) -> impl Future<Output = Result<Vec<Receipt>, JournalError>> + Send + '_ {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let sent = self.send(Pending { events, durable, class, reply: Reply::Task(reply) });
        async move {
            let receipts = match sent? {
                true => answer.await.unwrap_or(Err(JournalError::Stopped)),
                false => Ok(vec![]),
            };
            self.note_head(&receipts);
            receipts
        }
    }

    fn submit_blocking(
        &self,
        events: Vec<Event>,
        durable: bool,
        class: Class,
    ) -> Result<Vec<Receipt>, JournalError> {
        let (reply, answer) = mpsc::sync_channel(1);
        let receipts = match self.send(Pending { events, durable, class, reply: Reply::Thread(reply) })? {
            true => answer.recv().unwrap_or(Err(JournalError::Stopped)),
            false => Ok(vec![]),
        };
        self.note_head(&receipts);
        receipts
    }

    /// Queues an append for the writer; `false` with the journal off.
    fn send(&self, pending: Pending) -> Result<bool, JournalError> {
        let Some(inner) = &self.inner else { return Ok(false) };
        inner.queue.send(pending).map_err(|_| JournalError::Stopped)?;
        Ok(true)
    }
}

/// The last receipt of a batch (seq 0 with the journal off).
fn last(receipts: Result<Vec<Receipt>, JournalError>) -> Result<Receipt, JournalError> {
    Ok(receipts?.pop().unwrap_or(Receipt { seq: 0, hash: String::new() }))
}

/// A journal that cannot take a run refuses it: by the rule that refused
/// (the free-space floor), or as unavailable.
impl From<JournalError> for crate::error::BrokerError {
    fn from(e: JournalError) -> Self {
        match e.rule() {
            // The refusal names the configuration key that made it (the free-space floor).
            Some(_) => Self::Reply(events::journal_refusal(e)),
            None => Self::JournalUnavailable(e.to_string()),
        }
    }
}
