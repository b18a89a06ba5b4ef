//! Trust stages of the declared tools, kept in a state file that outlives
//! the broker: Draft → (an approver approves the declaration) → Trial →
//! (`trial_runs` approved runs exit 0) → Verified; an escalation, or a
//! change of the tool's declaration, puts it back to Draft.
//!
//! Every change is made under an exclusive lock of `<state>.lock` (a
//! daemon and the CLI's embedded broker may share the file), recorded in
//! the journal first (no record, no change), then written atomically:
//! a temporary file, fsync, rename, fsync of the directory.
//!
//! Each entry carries a MAC (HMAC-SHA256) with a key kept beside the file
//! (`<state>.key`, 0600, made at the first start), which no run can read
//! (see [`crate::decide::owned::owned`]): an entry that someone other than the
//! broker wrote or changed does not verify, and the tool is refused, with
//! that reason, until an approver approves it again.

use crate::error::BrokerError;
use crate::journal::attest::sha256_hex;
use crate::journal::{Event, Journal};
use nix::fcntl::{Flock, FlockArg};
use palisade_policy::{Config, ToolTrust, TrustStage};
use palisade_protocol::wire::ToolInfo;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The state file's name in the broker's state directory.
pub const STATE_FILE: &str = "trust.json";
/// The largest state file read (a few hundred bytes a tool).
const MAX_STATE_BYTES: u64 = 4 << 20;
/// The MAC key's length: HMAC-SHA256's block-sized key is more than its
/// output needs; 32 random bytes are its full strength.
const KEY_BYTES: usize = 32;
/// The rule that refuses a tool whose entry does not verify.
pub const TAMPERED_RULE: &str = "trust.tampered";

/// The lock beside the state file.
pub fn lock_path(state: &Path) -> PathBuf {
    state.with_extension("json.lock")
}

/// The MAC key beside the state file.
pub fn key_path(state: &Path) -> PathBuf {
    state.with_extension("json.key")
}

/// The state file: each tool's stage, for the declaration it was reached with.
#[derive(Serialize, Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct State {
    tools: BTreeMap<String, Entry>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
struct Entry {
    stage: String,
    /// sha256 of the declaration the stage was reached with.
    capabilities_sha256: String,
    /// Approved Trial runs that exited 0.
    successes: u32,
    /// HMAC-SHA256 of the tool's name and the fields above, hex (see [`TrustStore::mac`]).
    #[serde(default)]
    mac: String,
}

/// A declared tool as the configuration declares it.
struct Declared {
    declaration: String,
    sha256: String,
}

/// The declared tools of `config` where no trust stages are kept ([trust]
/// enabled = false): each `untracked`, with its declaration.
pub fn untracked(config: &Config) -> Vec<ToolInfo> {
    let tools = config.tools.iter().map(|(name, t)| {
        let declaration = t.declaration();
        ToolInfo {
            name: name.clone(),
            stage: "untracked".into(),
            trial_successes: 0,
            trial_runs: config.trust.trial_runs,
            capabilities_sha256: sha256_hex(declaration.as_bytes()),
            declaration,
        }
    });
    tools.collect()
}

/// The trust stages of this broker's declared tools.
pub struct TrustStore {
    path: PathBuf,
    trial_runs: u32,
    tools: BTreeMap<String, Declared>,
    journal: Journal,
    key: [u8; KEY_BYTES],
}

impl TrustStore {
    /// The store for `config`'s tools; `None` where trust stages are off or
    /// no tool is declared (nothing is read or written then). A declaration
    /// that changed since its stage was reached puts the tool back to Draft.
    pub fn open(config: &Config, journal: Journal) -> Result<Option<TrustStore>, String> {
        if !config.trust.enabled || config.tools.is_empty() {
            return Ok(None);
        }
        let path = match &config.trust.state {
            Some(p) => p.clone(),
            None => crate::host::paths::default_state_dir()
                .map_err(|e| format!("[trust] state: {e}"))?
                .join(STATE_FILE),
        };
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let tools = config
            .tools
            .iter()
            .map(|(name, t)| {
                let declaration = t.declaration();
                let sha256 = sha256_hex(declaration.as_bytes());
                (name.clone(), Declared { declaration, sha256 })
            })
            .collect();
        let key = read_or_make_key(&key_path(&path))?;
        let store = TrustStore { path, trial_runs: config.trust.trial_runs, tools, journal, key };
        store.reconcile().map_err(|e| e.to_string())?;
        Ok(Some(store))
    }

    /// Tools whose declaration changed go back to Draft (each a journal record).
    fn reconcile(&self) -> Result<(), BrokerError> {
        self.update(|state| {
            let mut changes = Vec::new();
            for (name, declared) in &self.tools {
                let Some(e) = state.tools.get_mut(name) else { continue };
                if e.capabilities_sha256 != declared.sha256 {
                    let from = std::mem::replace(&mut e.stage, TrustStage::Draft.name().into());
                    e.capabilities_sha256 = declared.sha256.clone();
                    e.successes = 0;
                    if from != TrustStage::Draft.name() {
                        changes.push(self.change(
                            name,
                            &from,
                            TrustStage::Draft,
                            "its declaration changed",
                            None,
                        ));
                    }
                }
            }
            Ok(changes)
        })
    }

    /// `tool`'s stage now (Draft for a tool never approved); refused when
    /// its entry was not written by a broker holding the key.
    pub fn stage(&self, tool: &str) -> Result<ToolTrust, BrokerError> {
        let state = self.locked(FlockArg::LockShared)?.0;
        if state.tools.get(tool).is_some_and(|e| !self.verifies(tool, e)) {
            tracing::warn!(tool, path = %self.path.display(), "a trust stage the broker did not write");
            return Err(BrokerError::Reply(palisade_protocol::wire::ErrorReply::with_rule(
                palisade_protocol::wire::ErrorKind::PolicyDenied,
                format!(
                    "tool {tool}: its trust stage in {} was not written by this broker (its MAC does not \
                     verify): it does not run until an approver approves it again (palisade tools approve {tool})",
                    self.path.display()
                ),
                TAMPERED_RULE,
            )));
        }
        Ok(self.trust_of(&state, tool))
    }

    /// The MAC of `tool`'s entry: its name and fields, each ended by a NUL
    /// (no field holds one), under a label naming the format.
    fn mac(&self, tool: &str, e: &Entry) -> String {
        use hmac::{KeyInit, Mac};
        let Ok(mut m) = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.key) else { return String::new() };
        for field in
            ["palisade trust entry v1", tool, &e.stage, &e.capabilities_sha256, &e.successes.to_string()]
        {
            m.update(field.as_bytes());
            m.update(b"\0");
        }
        m.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether `e` is what a broker holding the key wrote for `tool`
    /// (compared in constant time).
    fn verifies(&self, tool: &str, e: &Entry) -> bool {
        let (want, got) = (self.mac(tool, e), e.mac.as_bytes());
        want.len() == got.len() && want.bytes().zip(got).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }

    fn trust_of(&self, state: &State, tool: &str) -> ToolTrust {
        let current = self.tools.get(tool).and_then(|d| {
            state.tools.get(tool).filter(|e| e.capabilities_sha256 == d.sha256 && self.verifies(tool, e))
        });
        ToolTrust {
            stage: current.and_then(|e| TrustStage::named(&e.stage)).unwrap_or(TrustStage::Draft),
            successes: current.map_or(0, |e| e.successes),
            trial_runs: self.trial_runs,
        }
    }

    /// The declared tools, as `palisade tools show` prints them.
    pub fn list(&self) -> Result<Vec<ToolInfo>, BrokerError> {
        let state = self.locked(FlockArg::LockShared)?.0;
        Ok(self.tools.keys().map(|name| self.info(&state, name)).collect())
    }

    fn info(&self, state: &State, name: &str) -> ToolInfo {
        let t = self.trust_of(state, name);
        let d = &self.tools[name];
        ToolInfo {
            name: name.into(),
            stage: t.stage.name().into(),
            trial_successes: t.successes,
            trial_runs: t.trial_runs,
            declaration: d.declaration.clone(),
            capabilities_sha256: d.sha256.clone(),
        }
    }

    /// An approver's review of `tool`: Draft → Trial (a tool past Draft stays where it is).
    pub fn approve(&self, tool: &str, by_uid: u32) -> Result<ToolInfo, BrokerError> {
        self.declared(tool)?;
        self.update(|state| {
            if self.trust_of(state, tool).stage != TrustStage::Draft {
                return Ok(vec![]);
            }
            Ok(vec![self.set(state, tool, TrustStage::Trial, "its declaration was approved", Some(by_uid))])
        })?;
        let state = self.locked(FlockArg::LockShared)?.0;
        Ok(self.info(&state, tool))
    }

    /// An escalation of `tool` (`why` names it): back to Draft.
    pub fn escalate(&self, tool: &str, why: &str) -> Result<(), BrokerError> {
        self.update(|state| {
            if self.trust_of(state, tool).stage == TrustStage::Draft {
                return Ok(vec![]);
            }
            Ok(vec![self.set(state, tool, TrustStage::Draft, why, None)])
        })
    }

    /// An approved run of `tool` exited 0: in Trial, one more success, and
    /// Verified at `trial_runs`.
    pub fn succeeded(&self, tool: &str) -> Result<(), BrokerError> {
        self.update(|state| {
            let t = self.trust_of(state, tool);
            if t.stage != TrustStage::Trial {
                return Ok(vec![]);
            }
            if t.successes + 1 < self.trial_runs {
                if let Some(e) = state.tools.get_mut(tool) {
                    e.successes += 1;
                }
                return Ok(vec![]);
            }
            let why = format!("{} approved runs succeeded in Trial", self.trial_runs);
            Ok(vec![self.set(state, tool, TrustStage::Verified, &why, None)])
        })
    }

    fn declared(&self, tool: &str) -> Result<&Declared, BrokerError> {
        self.tools.get(tool).ok_or_else(|| {
            let known: Vec<&str> = self.tools.keys().map(String::as_str).collect();
            BrokerError::Reply(palisade_protocol::wire::ErrorReply::new(
                palisade_protocol::wire::ErrorKind::InvalidRequest,
                format!("no tool {tool:?} is declared (declared: {})", known.join(", ")),
            ))
        })
    }

    /// Puts `tool` at `to` in `state`; the journal event that records it.
    fn set(&self, state: &mut State, tool: &str, to: TrustStage, why: &str, by_uid: Option<u32>) -> Event {
        let from = self.trust_of(state, tool).stage;
        let sha = self.tools.get(tool).map_or_else(String::new, |d| d.sha256.clone());
        state.tools.insert(
            tool.into(),
            Entry { stage: to.name().into(), capabilities_sha256: sha, successes: 0, mac: String::new() },
        );
        self.change(tool, from.name(), to, why, by_uid)
    }

    fn change(&self, tool: &str, from: &str, to: TrustStage, why: &str, by_uid: Option<u32>) -> Event {
        Event::TrustChanged {
            tool: tool.into(),
            from: from.into(),
            to: to.name().into(),
            reason: why.into(),
            by_uid,
            capabilities_sha256: self.tools.get(tool).map_or_else(String::new, |d| d.sha256.clone()),
        }
    }

    /// Reads the state under an exclusive lock, lets `change` edit it and
    /// name the journal events of its transitions, records them, and writes
    /// the state back. A record that fails refuses the whole change.
    fn update(
        &self,
        change: impl FnOnce(&mut State) -> Result<Vec<Event>, BrokerError>,
    ) -> Result<(), BrokerError> {
        let (mut state, lock) = self.locked(FlockArg::LockExclusive)?;
        let before = state.tools.clone();
        let events = change(&mut state)?;
        // Signed: what verified before, and what this change wrote. An
        // entry someone else wrote stays unverified, whatever else changes.
        for (tool, e) in state.tools.iter_mut() {
            let old = before.get(tool);
            let changed = old.is_none_or(|o| {
                (&o.stage, &o.capabilities_sha256, o.successes)
                    != (&e.stage, &e.capabilities_sha256, e.successes)
            });
            if changed || old.is_some_and(|o| self.verifies(tool, o)) {
                e.mac = self.mac(tool, e);
            }
        }
        for event in events {
            tracing::info!(?event, "trust stage changed");
            self.journal
                .append_blocking(event)
                .map_err(|e| BrokerError::JournalUnavailable(e.to_string()))?;
        }
        if serde_json::to_vec(&state.tools).unwrap_or_default()
            != serde_json::to_vec(&before).unwrap_or_default()
        {
            write_atomically(&self.path, &state)?;
        }
        drop(lock);
        Ok(())
    }

    /// The state read under a lock of kind `arg`, held while the lock lives.
    fn locked(&self, arg: FlockArg) -> Result<(State, Flock<std::fs::File>), BrokerError> {
        let lock_path = lock_path(&self.path);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&lock_path)
            .map_err(|e| state_error(&lock_path, e))?;
        let lock = Flock::lock(file, arg).map_err(|(_, e)| state_error(&lock_path, e.into()))?;
        Ok((read_state(&self.path)?, lock))
    }
}

/// The MAC key at `path`, made (random, 0600, exclusively) when there is
/// none. A key that is not a regular file of [`KEY_BYTES`], owned by the
/// broker and private to it, is refused: the broker does not start on it.
fn read_or_make_key(path: &Path) -> Result<[u8; KEY_BYTES], String> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let open =
        || std::fs::OpenOptions::new().read(true).custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW).open(path);
    let file = match open() {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut key = [0u8; KEY_BYTES];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut r| r.read_exact(&mut key))
                .map_err(|e| format!("cannot read /dev/urandom for the trust key: {e}"))?;
            // Whole before it has its name (a link never replaces a file):
            // a broker starting at the same moment reads all of it or none.
            let tmp = path.with_extension(format!("json.key.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            let made = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(&tmp)
                .and_then(|mut f| f.write_all(&key).and_then(|()| f.sync_all()))
                .and_then(|()| std::fs::hard_link(&tmp, path));
            let _ = std::fs::remove_file(&tmp);
            match made {
                Ok(()) => return Ok(key),
                // Another broker of this user made it first: read theirs.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    open().map_err(|e| key_error(path, e))?
                }
                Err(e) => return Err(key_error(path, e)),
            }
        }
        Err(e) => return Err(key_error(path, e)),
    };
    let meta = file.metadata().map_err(|e| key_error(path, e))?;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.is_file() || meta.uid() != me || meta.mode() & 0o077 != 0 || meta.len() != KEY_BYTES as u64 {
        return Err(format!(
            "{}: the trust key must be a file of {KEY_BYTES} bytes owned by uid {me} and private to it (mode 0600)",
            path.display()
        ));
    }
    let mut key = [0u8; KEY_BYTES];
    (&file).read_exact(&mut key).map_err(|e| key_error(path, e))?;
    Ok(key)
}

fn key_error(path: &Path, e: std::io::Error) -> String {
    format!("the trust key {}: {e}", path.display())
}

/// The state at `path`; none yet is an empty one.
fn read_state(path: &Path) -> Result<State, BrokerError> {
    use std::io::Read;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(State::default()),
        Err(e) => return Err(state_error(path, e)),
    };
    let mut text = String::new();
    file.take(MAX_STATE_BYTES).read_to_string(&mut text).map_err(|e| state_error(path, e))?;
    serde_json::from_str(&text).map_err(|e| state_error(path, std::io::Error::other(e)))
}

/// Writes `state` to `path` so that a crash leaves the old file or the new
/// one: a temporary file beside it, fsync, rename, fsync of the directory.
fn write_atomically(path: &Path, state: &State) -> Result<(), BrokerError> {
    let tmp = path.with_extension(format!("json.tmp.{}", std::process::id()));
    let text = serde_json::to_vec_pretty(state).map_err(|e| state_error(path, std::io::Error::other(e)))?;
    let written = (|| {
        // A new file: one planted under this name is removed, never written through.
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(&text)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(|e| state_error(path, e))
}

fn state_error(path: &Path, e: std::io::Error) -> BrokerError {
    BrokerError::TrustState { path: path.to_path_buf(), source: e }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path, tool: &str) -> Config {
        let text = format!(
            "[trust]\ntrial_runs = 2\nstate = {:?}\n[tools.t]\npreset = \"file_processor\"\n{tool}",
            dir.join("trust.json")
        );
        Config::parse(&text, Path::new("test.toml")).unwrap()
    }

    #[test]
    fn draft_trial_verified_survive_a_reopen_and_a_changed_declaration_is_draft_again() {
        let dir = std::env::temp_dir().join(format!("palisade-trust-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = TrustStore::open(&config(&dir, ""), Journal::default()).unwrap().unwrap();
        assert_eq!(store.stage("t").unwrap().stage, TrustStage::Draft);
        // A success counts for nothing in Draft.
        store.succeeded("t").unwrap();
        assert_eq!(store.approve("t", 0).unwrap().stage, "trial");
        store.succeeded("t").unwrap();
        assert_eq!(
            store.stage("t").unwrap(),
            ToolTrust { stage: TrustStage::Trial, successes: 1, trial_runs: 2 }
        );
        drop(store);
        let store = TrustStore::open(&config(&dir, ""), Journal::default()).unwrap().unwrap();
        store.succeeded("t").unwrap();
        assert_eq!(store.stage("t").unwrap().stage, TrustStage::Verified);
        store.escalate("t", "PathOutOfScope").unwrap();
        assert_eq!(store.stage("t").unwrap().stage, TrustStage::Draft);
        store.approve("t", 0).unwrap();
        drop(store);
        let changed = config(&dir, "allow_interpreters = true\n");
        let store = TrustStore::open(&changed, Journal::default()).unwrap().unwrap();
        assert_eq!(store.stage("t").unwrap().stage, TrustStage::Draft);
        assert!(store.approve("nope", 0).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An entry the broker did not write (a stage edited in the file) does
    /// not verify: the tool is refused, and the refusal says who lifts it.
    #[test]
    fn an_edited_stage_is_refused_as_tampered() {
        let dir = std::env::temp_dir().join(format!("palisade-trust-tampered-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = TrustStore::open(&config(&dir, ""), Journal::default()).unwrap().unwrap();
        store.approve("t", 0).unwrap();
        assert_eq!(store.stage("t").unwrap().stage, TrustStage::Trial);
        let file = dir.join("trust.json");
        let mut state: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        state["tools"]["t"]["stage"] = "verified".into();
        std::fs::write(&file, serde_json::to_vec(&state).unwrap()).unwrap();
        let Err(BrokerError::Reply(e)) = store.stage("t") else { panic!("an edited stage verified") };
        assert_eq!(e.rule.as_deref(), Some(TAMPERED_RULE));
        palisade_policy::denial::names_a_fix_or_why_none("trust.tampered", &e.message).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
