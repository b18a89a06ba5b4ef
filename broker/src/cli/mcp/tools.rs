//! The tools `palisade mcp` offers, with the JSON schemas of their
//! arguments and descriptions written for a model: what the sandbox
//! allows, and what a refusal means.

use rmcp::model::{JsonObject, Tool};
use serde_json::{Value, json};
use std::sync::Arc;

/// What the returned output of each stream is cut to, unless asked otherwise.
pub const DEFAULT_OUTPUT_LIMIT: u64 = 32 * 1024;
/// The most a call may ask to be returned of each stream.
pub const MAX_OUTPUT_LIMIT: u64 = 1 << 20;

const SANDBOX: &str = "The command runs in palisade's sandbox, enforced by the kernel: it \
    sees the system's directories read-only, may write only its workspace, has no network \
    unless the policy grants host names, cannot read secrets (~/.ssh, credentials), and is \
    bounded in time, memory, processes and output. Interpreters (sh, python3, node) and \
    inline code (sh -c, python3 -c) run only where the policy allows them.";

const REFUSALS: &str = "A refusal is an error whose data carries palisade's stable `kind` \
    (PolicyDenied, WorkspaceScopeDenied, CapabilityDenied, InvalidRequest, ...), the \
    policy `rule` and a `message` naming what was refused: do not retry the same \
    command; change it (another path, no interpreter) or tell the person what the \
    policy would need.";

/// The tools, for `tools/list`.
pub fn all() -> Vec<Tool> {
    vec![
        tool(
            "run_command",
            &format!(
                "Run a command in a sandbox and get its stdout, stderr and exit status. {SANDBOX} \
                 Give `argv` (run as is, no shell) or `command` (a command line: without shell \
                 syntax it is split into words and run the same way; with pipes, &&, ;, \
                 redirections, $ or globs it runs as `sh -c`, which the policy must allow). \
                 Output beyond `output_limit_bytes` per stream is cut in the middle with a \
                 marker (the beginning and the end are kept). A run palisade ended (timed out, \
                 over its output or memory quota) is a result with `is_error` and its \
                 `error_kind`; so is a run whose writes did not all land in the workspace \
                 (held for review as a change set, partly applied, or discarded: \
                 `writes_landed` false, and `changes` says which and why). {REFUSALS}"
            ),
            run_schema(false),
        ),
        tool(
            "run_tool",
            &format!(
                "Run a tool the policy declares, with its parameters (paths the tool is \
                 granted), and get its stdout, stderr and exit status. Each declared tool \
                 has capabilities of its own (`palisade tools show` lists them). {SANDBOX} \
                 {REFUSALS}"
            ),
            run_schema(true),
        ),
        tool(
            "run_plugin",
            &format!(
                "Call an installed WebAssembly skill plugin with a JSON input and get its JSON                  output. The plugin runs in a WebAssembly runtime inside palisade's own jail,                  bounded by fuel, memory and a deadline, and reaches nothing but what its                  manifest was granted (HTTP hosts, secrets, storage) within the policy. Plugins                  are off unless the policy enables them. {REFUSALS}"
            ),
            json!({
                "type": "object",
                "properties": {
                    "skill": {"type": "string", "description": "The installed skill's name (`palisade plugin list`)."},
                    "input": {"description": "The plugin's input: any JSON value."},
                    "timeout_ms": {"type": "integer", "minimum": 1, "description": "A deadline (the policy's is the most)."}
                },
                "required": ["skill"],
                "additionalProperties": false
            }),
        ),
        tool(
            "explain",
            "Say, without running anything, whether the policy would allow a command and the \
             sandbox it would get (writable and read-only paths, network, limits, seccomp): \
             `decision` is allow, needs_approval or deny (with `kind`, `rule` and `reason`). \
             Use it to find out what a refusal would be before running.",
            explain_schema(),
        ),
        tool(
            "list_changes",
            "List your change sets held for review: a run's writes that were not applied to the \
             workspace (the run was ended, was run holding its changes, or changed paths someone \
             else changed meanwhile, or files the host executes such as git hooks).",
            json!({ "type": "object", "properties": {} }),
        ),
        tool(
            "show_changes",
            "Show a held change set: its paths (file, symlink, dir, delete), which conflict with \
             the workspace's and which are files the host executes, and a unified diff of its \
             text files against the workspace's.",
            id_schema(),
        ),
        tool(
            "apply_changes",
            "Apply a held change set to the workspace, each file whole or not at all. A path \
             someone else changed stays as the person left it, and files the host executes (git \
             hooks, .envrc, ...) are never applied here: the person applies those.",
            id_schema(),
        ),
        tool("discard_changes", "Drop a held change set: its writes are not applied.", id_schema()),
        tool(
            "session_start",
            "Start a session: a sandbox that stays, in this server's workspace with its policy, for \
             the commands session_exec runs in it. What one command leaves running (a dev server) \
             or writes, the next finds; nothing else of the machine reaches it. It ends when \
             stopped, idle (`idle_timeout_secs`, default 900), too old (`max_lifetime_secs`), or \
             with this server. Returns its `name`.",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "Its name (default: the broker's choice)."},
                    "idle_timeout_secs": {"type": "integer", "minimum": 1},
                    "max_lifetime_secs": {"type": "integer", "minimum": 1}
                },
                "additionalProperties": false
            }),
        ),
        tool(
            "session_exec",
            &format!(
                "Run a command in a session (session_start) and get its stdout, stderr and exit \
                 status, as run_command does; the policy decides it like a run, in the session's \
                 sandbox. {REFUSALS}"
            ),
            session_exec_schema(),
        ),
        tool(
            "session_stop",
            "Stop a session, killing everything in it; its writes are settled as a run's that ended by itself.",
            json!({
                "type": "object",
                "properties": {"session": {"type": "string", "description": "The session's name."}},
                "required": ["session"],
                "additionalProperties": false
            }),
        ),
        tool(
            "session_list",
            "List your sessions.",
            json!({ "type": "object", "properties": {}, "additionalProperties": false }),
        ),
    ]
}

/// `session_exec`'s arguments: the session, the command and its own fields.
fn session_exec_schema() -> Value {
    let Value::Object(mut props) = run_schema(false)["properties"].clone() else { unreachable!() };
    props.remove("workspace");
    props.remove("session");
    props.insert("session".into(), json!({"type": "string", "description": "The session's name."}));
    props.insert(
        "shell".into(),
        json!({"type": "boolean", "description": "Run `command` as a line of the session's shell: the \
               working directory and exported variables one shell line leaves, the next starts with \
               (`cd src`, then `make`). Runs as `sh -c`."}),
    );
    json!({"type": "object", "properties": props, "required": ["session"], "additionalProperties": false})
}

fn id_schema() -> Value {
    json!({
        "type": "object",
        "properties": { "id": { "type": "string", "description": "The change set's id (list_changes)." } },
        "required": ["id"]
    })
}

fn tool(name: &'static str, description: &str, schema: Value) -> Tool {
    let Value::Object(schema) = schema else { unreachable!("the schemas are objects") };
    Tool::new(name, description.to_string(), Arc::new(schema as JsonObject))
}

/// What every run and explain names: the command and where it runs.
fn command_properties() -> serde_json::Map<String, Value> {
    let props = json!({
        "argv": {
            "type": "array", "items": {"type": "string"}, "minItems": 1,
            "description": "The command and its arguments, run as is (no shell). Give this or `command`."
        },
        "command": {
            "type": "string",
            "description": "A command line: split into words when it has no shell syntax, else run as `sh -c`."
        },
        "workspace": {
            "type": "string",
            "description": "The directory the command may write and runs in: the server's workspace \
                            (the default) or a directory inside it, relative to it or absolute."
        }
    });
    match props {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

fn run_schema(declared_tool: bool) -> Value {
    let mut props = command_properties();
    props.insert(
        "stdin".into(),
        json!({"type": "string", "description": "Text given to the command's stdin."}),
    );
    props.insert(
        "timeout_secs".into(),
        json!({"type": "integer", "minimum": 1, "description": "A deadline, in seconds: at most the policy's max_execution_time (a larger one is refused, naming it)."}),
    );
    props.insert(
        "output_limit_bytes".into(),
        json!({
            "type": "integer", "minimum": 256, "maximum": MAX_OUTPUT_LIMIT,
            "description": format!("The most of stdout, and of stderr, returned (default {DEFAULT_OUTPUT_LIMIT}); \
                                    the run's own output quota is the policy's.")
        }),
    );
    let mut required = vec![];
    if !declared_tool {
        props.insert(
            "session".into(),
            json!({"type": "string", "description": "Run it in this session (session_start), in its sandbox; no workspace then."}),
        );
    }
    if declared_tool {
        props.insert("tool".into(), json!({"type": "string", "description": "The declared tool's name."}));
        props.insert(
            "params".into(),
            params_schema("The tool's parameters: a path, or a list of paths, per name."),
        );
        required.push("tool");
    }
    json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
}

fn explain_schema() -> Value {
    let mut props = command_properties();
    props.insert(
        "tool".into(),
        json!({"type": "string", "description": "A declared tool, instead of the default profile."}),
    );
    props.insert("params".into(), params_schema("The tool's parameters."));
    json!({"type": "object", "properties": props, "additionalProperties": false})
}

/// A declared tool's parameters: a path, or a list of paths, per name.
fn params_schema(description: &str) -> Value {
    json!({
        "type": "object",
        "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "description": description
    })
}
