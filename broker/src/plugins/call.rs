//! One plugin call: recorded, decided, run in the plugin-host with its host
//! functions served, recorded again, attested.

use super::*;
use crate::host::requester::Peer;
use crate::journal::events::journal_refusal;
use crate::journal::{Event, Journal};
use palisade_protocol::plugin::{CallDone, PluginHostJail, PluginStore};
use store::STORAGE_DIR;

/// What came back of a call that ran.
struct Ran {
    done: CallDone,
    host_calls: u64,
    host_calls_refused: u64,
    jail: PluginHostJail,
}

impl Plugins {
    /// Runs one call: `plugin_called` is on disk before anything runs, and
    /// `plugin_finished` before the answer goes out (its seq and hash in
    /// the attestation); a call that cannot be recorded is refused.
    pub async fn call(
        &self,
        journal: &Journal,
        peer: &Peer,
        request: CallRequest,
    ) -> Result<CallResult, ErrorReply> {
        let call_id = self.next_call_id();
        let started = Instant::now();
        let prepared = self.prepare(&request);
        let refused = prepared.as_ref().err();
        // Like a run's first records: written now, synced with the call's
        // last record (a refusal is the last: synced before the answer).
        journal
            .append_all(
                vec![Event::PluginCalled {
                    call_id,
                    uid: peer.uid,
                    pid: peer.pid,
                    skill: request.skill.clone(),
                    inline: request.inline_module.is_some(),
                    module_sha256: prepared.as_ref().ok().map(|p| p.sha256.clone()),
                    decision: if refused.is_some() { "deny" } else { "allow" }.into(),
                    kind: refused.map(|e| e.kind.name().to_string()),
                    reason: refused.map(|e| e.message.clone()),
                }],
                refused.is_some(),
            )
            .await
            .map_err(journal_refusal)?;
        let prepared = prepared?;
        let limits = self.limits(request.timeout_ms);
        let store = self.store(&prepared, peer.uid);
        let ran = match &store {
            Ok(store) => {
                self.execute(call_id, &prepared, store.as_ref(), request.input.as_bytes(), limits).await
            }
            Err(e) => Err(e.clone()),
        };
        let result = ran.and_then(|ran| answer(&prepared, store.ok().flatten().as_ref(), limits, ran));
        let (outcome, message) = match &result {
            Ok(_) => ("ok".to_string(), None),
            Err(e) => (e.kind.name().to_string(), Some(e.message.clone())),
        };
        let used = result.as_ref().ok().map(|r| &r.attestation);
        let receipt = journal
            .append(Event::PluginFinished {
                call_id,
                skill: prepared.skill.clone(),
                outcome,
                message,
                fuel_used: used.map_or(0, |a| a.fuel_used),
                memory_peak_bytes: used.map_or(0, |a| a.memory_peak_bytes),
                host_calls: used.map_or(0, |a| a.host_calls),
                host_calls_refused: used.map_or(0, |a| a.host_calls_refused),
                wall_ms: started.elapsed().as_millis() as u64,
            })
            .await
            .map_err(journal_refusal)?;
        let mut result = result?;
        if journal.enabled() {
            result.attestation.journal =
                Some(palisade_protocol::attest::JournalRecord { seq: receipt.seq, hash: receipt.hash });
        }
        Ok(result)
    }

    /// The requester's storage of the call's skill, when the call is granted storage.
    fn store(&self, prepared: &Prepared, uid: u32) -> Result<Option<Storage>, ErrorReply> {
        if prepared.grants.storage_prefixes.is_empty() {
            return Ok(None);
        }
        let root = self.index.dir.join(STORAGE_DIR);
        Storage::new(root, uid, &prepared.skill, self.config.storage_quota_bytes)
            .map(Some)
            .map_err(|e| refusal(ErrorKind::InvalidRequest, e.to_string(), "plugins.storage"))
    }

    /// Runs the call in the plugin-host (started if it is not running); a
    /// host that died or broke the channel is killed and its call failed,
    /// and the next call starts a new one.
    async fn execute(
        &self,
        id: u64,
        prepared: &Prepared,
        storage: Option<&Storage>,
        input: &[u8],
        limits: PluginLimits,
    ) -> Result<Ran, ErrorReply> {
        let deadline = Instant::now() + Duration::from_millis(limits.deadline_ms);
        let mut slot = self.host.lock().await;
        let host = self.running(&mut slot).await?;
        let jail = host.jail.clone();
        let call = Exchange { id, prepared, storage, input, limits, deadline };
        let exchanged = self.exchange(host, &call).await;
        let failed = |kind, e: &CallError| refusal(kind, e.to_string(), "plugins.runtime");
        match exchanged {
            Ok((done, host_calls, host_calls_refused)) => {
                Ok(Ran { done, host_calls, host_calls_refused, jail })
            }
            Err(e @ (CallError::BadModule(_) | CallError::Cache(_))) => {
                Err(failed(ErrorKind::RuntimeFailure, &e))
            }
            Err(e) => {
                if let Some(dead) = slot.take() {
                    tracing::warn!(pid = dead.pid, "plugin-host ended: {e}");
                    dead.kill();
                }
                let kind = if matches!(e, CallError::Stuck(_)) {
                    ErrorKind::QuotaExceeded
                } else {
                    ErrorKind::RuntimeFailure
                };
                Err(failed(kind, &e))
            }
        }
    }

    /// The call on the channel: compile if needed, `Call`, then serve its
    /// host functions until `Done`.
    async fn exchange(
        &self,
        host: &mut Running,
        call: &Exchange<'_>,
    ) -> Result<(CallDone, u64, u64), CallError> {
        let artifact = self.artifact(host, call.id, call.prepared).await?;
        let result = self.converse(host, call, &artifact).await;
        // An inline module's artifact (or one past the cache's bound) goes
        // with its call, however it ended (two unlinks: before the answer).
        self.cache.remove_transient(&artifact);
        result
    }

    /// `Call` for the artifact, then its host functions served until `Done`.
    async fn converse(
        &self,
        host: &mut Running,
        call: &Exchange<'_>,
        artifact: &Artifact,
    ) -> Result<(CallDone, u64, u64), CallError> {
        let Exchange { id, prepared, storage, input, limits, deadline } = *call;
        let egress = egress_plan(&prepared.grants, &self.egress);
        let ctx = CallContext {
            skill: &prepared.skill,
            grants: &prepared.grants,
            secrets: &self.secrets,
            storage,
            egress: &egress,
            deadline,
        };
        host.send(&ToHost::Call(PluginCall {
            id,
            artifact: artifact.path.to_string_lossy().into_owned(),
            module_sha256: prepared.sha256.clone(),
            entry: prepared.entry.clone(),
            input: input.to_vec(),
            limits,
            granted: prepared.grants.host_functions(),
        }))
        .await?;
        let (mut calls, mut refused) = (0, 0);
        loop {
            let message = match tokio::time::timeout_at(deadline + DEADLINE_GRACE, host.receive()).await {
                Ok(m) => m?,
                Err(_) => return Err(CallError::Stuck(DEADLINE_GRACE)),
            };
            match message {
                FromHost::HostCall { id: call, function, args } => {
                    calls += 1;
                    let result = hostfn::serve(&ctx, function, &args).await;
                    if let Err(e) = &result {
                        refused += 1;
                        tracing::info!(skill = %prepared.skill, function = function.name(), kind = %e.kind, "host function refused: {}", e.message);
                    }
                    host.send(&ToHost::HostReply { id: call, result }).await?;
                }
                FromHost::Done(done) if done.id == id => return Ok((done, calls, refused)),
                FromHost::Failed { message, .. } => {
                    return Err(CallError::Host(HostError::Protocol(message)));
                }
                other => {
                    return Err(CallError::Host(HostError::Protocol(format!("{other:?} during a call"))));
                }
            }
        }
    }
}

/// One call's part on the channel.
#[derive(Clone, Copy)]
struct Exchange<'a> {
    id: u64,
    prepared: &'a Prepared,
    storage: Option<&'a Storage>,
    input: &'a [u8],
    limits: PluginLimits,
    deadline: Instant,
}

/// The client's answer: the output, or the outcome's error kind.
fn answer(
    prepared: &Prepared,
    store: Option<&Storage>,
    limits: PluginLimits,
    ran: Ran,
) -> Result<CallResult, ErrorReply> {
    let Ran { done, host_calls, host_calls_refused, jail } = ran;
    let output = match done.outcome {
        CallOutcome::Output(bytes) => String::from_utf8(bytes).map_err(|_| {
            refusal(ErrorKind::RuntimeFailure, "the plugin's output is not UTF-8", "plugins.output")
        })?,
        CallOutcome::QuotaExceeded(what) => {
            return Err(refusal(ErrorKind::QuotaExceeded, what, "plugins.limit"));
        }
        CallOutcome::CapabilityDenied(what) => {
            return Err(refusal(ErrorKind::CapabilityDenied, what, "plugins.not_granted"));
        }
        CallOutcome::Trap(what) => return Err(refusal(ErrorKind::RuntimeFailure, what, "plugins.trap")),
    };
    Ok(CallResult {
        output,
        fuel_used: done.fuel_used,
        memory_peak_bytes: done.memory_peak_bytes,
        instantiate_us: done.instantiate_us,
        call_us: done.call_us,
        attestation: PluginAttestation {
            skill: prepared.skill.clone(),
            module_sha256: prepared.sha256.clone(),
            entry: prepared.entry.clone(),
            grants: grants_in_force(&prepared.grants),
            limits,
            fuel_used: done.fuel_used,
            memory_peak_bytes: done.memory_peak_bytes,
            host_calls,
            host_calls_refused,
            jail,
            journal: None,
            store: store.map(|s| PluginStore {
                uid: s.uid(),
                skill: s.skill().to_string(),
                quota_bytes: s.quota(),
            }),
        },
    })
}
