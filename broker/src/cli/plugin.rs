//! `palisade plugin`: install and list skills, call one (through the
//! running broker or an embedded one), set a secret.

use crate::cli::client::ClientError;
use crate::cli::discovery::BrokerArgs;
use crate::cli::run::EXIT_PALISADE;
use crate::decide::service::Broker;
use crate::host::requester::Peer;
use crate::plugins::index::Index;
use crate::plugins::store::Secrets;
use clap::Subcommand;
use palisade_policy::Config;
use palisade_protocol::wire::{ClientMessage, ErrorKind, ErrorReply, ServerMessage};
use std::io::Read;
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum PluginCommand {
    /// Install the skill of MANIFEST (TOML): its module's sha256 verified,
    /// module and manifest copied into the skills index.
    Install {
        manifest: PathBuf,
        /// Policy file (for `[plugins] skills_dir`).
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
    },
    /// Remove the installed skill NAME: its manifest, its module, its
    /// compiled module and every requester's storage of it.
    Remove {
        name: String,
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
    },
    /// List the installed skills: name, version, sha256, capabilities.
    List {
        #[arg(long)]
        json: bool,
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
    },
    /// Call skill NAME with --input (JSON text); prints its output.
    /// Exits 0, or 125 when refused or failed.
    Run {
        name: String,
        #[arg(long, value_name = "JSON", default_value = "{}")]
        input: String,
        /// Lowers the policy's deadline.
        #[arg(long, value_name = "MS")]
        timeout_ms: Option<u64>,
        /// Print the whole answer (output, usage, attestation) as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerArgs,
        /// Run in an embedded broker under this policy file, instead of a running broker.
        #[arg(long, value_name = "FILE", conflicts_with = "socket")]
        policy: Option<PathBuf>,
    },
    /// The broker's secret store.
    #[command(subcommand)]
    Secret(SecretCommand),
}

#[derive(Subcommand, Debug)]
pub enum SecretCommand {
    /// Set secret KEY to the value read from stdin (one trailing newline
    /// dropped), as a 0600 file of the state directory's `secrets/`.
    Set {
        key: String,
        /// Policy file (for `[plugins] secrets_dir`).
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
    },
}

fn fail(kind: ErrorKind, message: impl std::fmt::Display) -> i32 {
    eprintln!("palisade: {kind}: {message}");
    EXIT_PALISADE
}

fn config(policy: Option<&PathBuf>) -> Result<Config, String> {
    policy.map_or_else(Config::own_or_default, |p| Config::load(p)).map_err(|e| e.to_string())
}

pub fn main(command: PluginCommand) -> i32 {
    match command {
        PluginCommand::Install { manifest, policy } => install(&manifest, policy.as_ref()),
        PluginCommand::Remove { name, policy } => remove(&name, policy.as_ref()),
        PluginCommand::List { json, policy } => list(json, policy.as_ref()),
        PluginCommand::Run { name, input, timeout_ms, json, broker, policy } => {
            let message = ClientMessage::RunPlugin { skill: name, input, inline_module: None, timeout_ms };
            let reply = match policy {
                Some(p) => crate::cli::discovery::may_embed(crate::cli::discovery::POLICY_EMBEDS)
                    .map_err(|e| ErrorReply::new(e.kind(), e.to_string()))
                    .and_then(|()| {
                        Config::load(&p)
                            .map_err(|e| ErrorReply::new(ErrorKind::InvalidRequest, e.to_string()))
                    })
                    .and_then(|c| embedded(c, message)),
                None => through_broker(&broker, message),
            };
            render(reply, json)
        }
        PluginCommand::Secret(SecretCommand::Set { key, policy }) => secret_set(&key, policy.as_ref()),
    }
}

fn index(policy: Option<&PathBuf>) -> Result<Index, String> {
    let config = config(policy)?;
    let (skills, _) = crate::plugins::dirs(&config.plugins)?;
    Ok(Index { dir: skills })
}

fn install(manifest: &std::path::Path, policy: Option<&PathBuf>) -> i32 {
    let index = match index(policy) {
        Ok(i) => i,
        Err(e) => return fail(ErrorKind::InvalidRequest, e),
    };
    let installed = index.install(manifest);
    // An older version's compiled module, and anything else no skill names.
    crate::plugins::sweep_cache(&index, None);
    match installed {
        Ok(m) => {
            palisade_cli::outln!(
                "installed {} {} ({}) in {}",
                m.name,
                m.version,
                m.sha256,
                index.dir.join(&m.name).display()
            );
            0
        }
        Err(e) => fail(ErrorKind::InvalidRequest, e),
    }
}

fn remove(name: &str, policy: Option<&PathBuf>) -> i32 {
    let index = match index(policy) {
        Ok(i) => i,
        Err(e) => return fail(ErrorKind::InvalidRequest, e),
    };
    let removed = index.remove(name);
    crate::plugins::sweep_cache(&index, None);
    match removed {
        Ok(()) => {
            palisade_cli::outln!("removed {name} from {}", index.dir.display());
            0
        }
        Err(e) => fail(ErrorKind::InvalidRequest, e),
    }
}

fn list(json: bool, policy: Option<&PathBuf>) -> i32 {
    let skills = match index(policy).and_then(|i| i.list().map_err(|e| e.to_string())) {
        Ok(s) => s,
        Err(e) => return palisade_cli::json_fail(json, ErrorKind::RuntimeFailure, e),
    };
    if json {
        palisade_cli::outln!("{}", serde_json::to_string(&skills).unwrap_or_default());
        return 0;
    }
    for m in &skills {
        let c = &m.capabilities;
        palisade_cli::outln!(
            "{} {} sha256:{} entry:{}\n  http_hosts: {:?}  secrets: {:?}  storage_prefixes: {:?}  log: {}",
            m.name,
            m.version,
            m.sha256,
            m.entry,
            c.http_hosts,
            c.secrets,
            c.storage_prefixes,
            c.log
        );
    }
    0
}

fn secret_set(key: &str, policy: Option<&PathBuf>) -> i32 {
    let dir = match config(policy).and_then(|c| crate::plugins::dirs(&c.plugins)) {
        Ok((_, secrets)) => secrets,
        Err(e) => return fail(ErrorKind::InvalidRequest, e),
    };
    let mut value = Vec::new();
    let max = crate::plugins::store::MAX_SECRET_BYTES;
    if let Err(e) = std::io::stdin().take(max + 2).read_to_end(&mut value) {
        return fail(ErrorKind::InvalidRequest, format!("reading the value from stdin: {e}"));
    }
    if value.ends_with(b"\n") {
        value.pop();
    }
    match (Secrets { dir }).set(key, &value) {
        Ok(()) => 0,
        Err(e) => fail(ErrorKind::InvalidRequest, e),
    }
}

fn through_broker(args: &BrokerArgs, message: ClientMessage) -> Result<ServerMessage, ErrorReply> {
    let mut found = match crate::cli::discovery::find(args.socket.as_deref(), true) {
        Ok(crate::cli::discovery::Route::Broker(found)) => found,
        Ok(crate::cli::discovery::Route::Embedded { tried }) => {
            tracing::debug!("no broker answers on {tried}: calling in an embedded one");
            let config = Config::own_or_default()
                .map_err(|e| ErrorReply::new(ErrorKind::InvalidRequest, e.to_string()))?;
            return embedded(config, message);
        }
        Err(e) => return Err(ErrorReply::new(e.kind(), e.to_string())),
    };
    match found.client.request(&message) {
        Ok(r) => Ok(r),
        Err(ClientError::Reply(e)) => Err(e),
        Err(e) => Err(ErrorReply::new(ErrorKind::RuntimeFailure, format!("{}: {e}", found.name()))),
    }
}

/// One call in a broker of this process's own.
fn embedded(mut config: Config, message: ClientMessage) -> Result<ServerMessage, ErrorReply> {
    crate::serve::daemon::init_tracing("warn");
    config.broker.prespawn = 0;
    config.broker.etc_snapshot = false;
    let ClientMessage::RunPlugin { skill, input, inline_module, timeout_ms } = message else {
        return Err(ErrorReply::new(ErrorKind::InvalidRequest, "not a plugin call"));
    };
    let broker = Broker::assemble(config, None).map_err(|e| ErrorReply::new(ErrorKind::RuntimeFailure, e))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ErrorReply::new(ErrorKind::RuntimeFailure, e.to_string()))?;
    let (uid, gid) = (broker.context.uid, broker.context.gid);
    let groups = crate::host::requester::Requester::me().groups;
    let peer = Peer { uid, gid, pid: Some(std::process::id() as i32), groups };
    let request = crate::plugins::CallRequest { skill, input, inline_module, timeout_ms };
    let Some(plugins) = &broker.plugins else {
        return Err(ErrorReply::new(ErrorKind::Unavailable, "this broker serves no plugins"));
    };
    let result = runtime.block_on(plugins.call(&broker.journal, &peer, request));
    runtime.shutdown_background();
    result.map(ServerMessage::from)
}

fn render(reply: Result<ServerMessage, ErrorReply>, json: bool) -> i32 {
    let message = match reply {
        Ok(m) => m,
        Err(e) => ServerMessage::Error(e),
    };
    if json {
        palisade_cli::outln!("{}", serde_json::to_string(&message).unwrap_or_default());
    }
    match message {
        ServerMessage::PluginResult { output, .. } => {
            if !json {
                palisade_cli::outln!("{output}");
            }
            0
        }
        ServerMessage::Error(_) if json => EXIT_PALISADE,
        ServerMessage::Error(e) => match &e.rule {
            Some(rule) => fail(e.kind, format!("{} [{rule}]", e.message)),
            None => fail(e.kind, e.message),
        },
        other => fail(ErrorKind::ProtocolError, format!("unexpected reply {other:?}")),
    }
}
