//! Real work through palisade: `cargo build` of a small crate with
//! dependencies (vendored from the local registry's cache), a venv with
//! `pip install` of a local wheel, `npm install` of a local tarball, and
//! 20,000 small files written. Each bare, through bwrap (the same binds a
//! sandbox would need: the system read-only, the workspace writable), and
//! through `palisade run` (the embedded broker, and a daemon), on a fresh
//! copy of the same workspace every time (the copy untimed; the last one
//! moved aside, removed after the work's rounds), the launchers
//! interleaved in every round; medians. palisade's runs write to a change
//! set that is applied when they end: where its time past the command's
//! goes is read from the embedded broker's own log (its `settle timeline`:
//! taking the writes, with each entry's conflict check and hash, and
//! applying them).

use crate::{Daemon, bin, percentile};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// One kind of work: its name, what makes its workspace, and its script.
struct Work {
    name: &'static str,
    script: String,
}

/// The launchers, in the order of the table.
const LAUNCHERS: [&str; 4] = ["bare", "bwrap", "palisade run (embedded)", "palisade run (daemon)"];

/// The version of `name` the workspace's own lock file pins (what the local
/// registry's cache holds, whatever the network).
fn locked_version(name: &str) -> Option<String> {
    let lock = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.lock")).ok()?;
    let pattern = format!("name = \"{name}\"\nversion = \"");
    let rest = &lock[lock.find(&pattern)? + pattern.len()..];
    Some(rest[..rest.find('"')?].to_string())
}

fn sh(dir: &Path, script: &str) -> Result<(), String> {
    let o = Command::new("sh").args(["-c", script]).current_dir(dir).output().map_err(|e| e.to_string())?;
    match o.status.success() {
        true => Ok(()),
        false => Err(format!("{script}: {}", String::from_utf8_lossy(&o.stderr))),
    }
}

/// A crate with `serde_json` and `regex`, vendored (offline) in the workspace.
fn cargo_work(ws: &Path, sysroot: &Path) -> Result<Work, String> {
    let (json, regex) = (locked_version("serde_json"), locked_version("regex"));
    let (Some(json), Some(regex)) = (json, regex) else {
        return Err("Cargo.lock pins no serde_json or regex".into());
    };
    let app = ws.join("app");
    std::fs::create_dir_all(app.join("src")).map_err(|e| e.to_string())?;
    let manifest = format!(
        "[package]\nname = \"app\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\n\
         serde_json = \"={json}\"\nregex = \"={regex}\"\n"
    );
    let main = "fn main() {\n    let v: serde_json::Value = serde_json::from_str(\"{\\\"a\\\": 1}\").unwrap();\n    \
                let r = regex::Regex::new(\"a+\").unwrap();\n    println!(\"{} {}\", v[\"a\"], r.is_match(\"aa\"));\n}\n";
    std::fs::write(app.join("Cargo.toml"), manifest).map_err(|e| e.to_string())?;
    std::fs::write(app.join("src/main.rs"), main).map_err(|e| e.to_string())?;
    let cargo = sysroot.join("bin/cargo");
    let vendor = format!(
        "{0} generate-lockfile --offline -q && {0} vendor --offline --locked -q ../vendor >/dev/null",
        cargo.display()
    );
    sh(&app, &vendor)?;
    let config =
        "[source.crates-io]\nreplace-with = \"vendored\"\n\n[source.vendored]\ndirectory = \"../vendor\"\n";
    std::fs::create_dir_all(app.join(".cargo")).map_err(|e| e.to_string())?;
    std::fs::write(app.join(".cargo/config.toml"), config).map_err(|e| e.to_string())?;
    let script = format!(
        "set -e; export PATH={}/bin:$PATH CARGO_HOME=$PWD/.cargo-home CARGO_INCREMENTAL=0\n\
         cd app && cargo build -q --offline && ./target/debug/app >/dev/null",
        sysroot.display()
    );
    Ok(Work { name: "cargo build (serde_json, regex)", script })
}

/// A wheel of one module, made with the standard library.
fn pip_work(ws: &Path) -> Result<Work, String> {
    let make = r#"
import base64, hashlib, sys, zipfile
files = {"hello.py": b"def hello():\n    return 'hello'\n",
         "hello-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: hello\nVersion: 1.0\n",
         "hello-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
record = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}" for n, d in files.items()]
files["hello-1.0.dist-info/RECORD"] = ("\n".join(record + ["hello-1.0.dist-info/RECORD,,"]) + "\n").encode()
with zipfile.ZipFile("hello-1.0-py3-none-any.whl", "w") as z:
    for n, d in files.items():
        z.writestr(n, d)
"#;
    let o = Command::new("python3").args(["-c", make]).current_dir(ws).output().map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    let script = "set -e; python3 -m venv .venv\n\
                  .venv/bin/pip install -q --no-index --no-cache-dir --disable-pip-version-check ./hello-1.0-py3-none-any.whl\n\
                  .venv/bin/python -c 'import hello'";
    Ok(Work { name: "python3 -m venv, pip install (a local wheel)", script: script.into() })
}

/// A package packed by npm, and a project that installs it.
fn npm_work(ws: &Path) -> Result<Work, String> {
    let pkg = ws.join("pkg");
    std::fs::create_dir_all(&pkg).map_err(|e| e.to_string())?;
    std::fs::write(pkg.join("package.json"), r#"{"name": "hello", "version": "1.0.0", "main": "index.js"}"#)
        .map_err(|e| e.to_string())?;
    std::fs::write(pkg.join("index.js"), "module.exports = () => 'hello';\n").map_err(|e| e.to_string())?;
    sh(&pkg, "HOME=$PWD/../.pack-home npm pack --silent --pack-destination .. >/dev/null")?;
    std::fs::remove_dir_all(&pkg).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(ws.join(".pack-home"));
    std::fs::write(ws.join("package.json"), r#"{"name": "app", "version": "1.0.0", "private": true}"#)
        .map_err(|e| e.to_string())?;
    let script = "set -e; npm install --offline --no-audit --no-fund --loglevel=error --cache $PWD/.npm-cache ./hello-1.0.0.tgz\n\
                  node -e 'require(\"hello\")'";
    Ok(Work { name: "npm install (a local tarball)", script: script.into() })
}

fn files_work() -> Work {
    let script = "python3 -c \"import os\nos.makedirs('many')\n\
                  for i in range(20000): open('many/f%05d' % i, 'w').write(str(i))\"";
    Work { name: "20,000 files written", script: script.into() }
}

/// What runs each launcher's command, on `ws`.
struct Runner {
    ws: PathBuf,
    /// bwrap is installed (bench/run.sh installs it): its column, else none.
    has_bwrap: bool,
    bwrap: Vec<String>,
    policy: PathBuf,
    state: PathBuf,
    /// Where each run's workspace goes after it (see [`Runner::once`]).
    trash: PathBuf,
    daemon: Daemon,
    /// The environment every launcher gives the command.
    env: Vec<(String, String)>,
}

impl Runner {
    fn command(&self, launcher: usize, script: &str) -> Command {
        let palisade = bin("palisade");
        let mut c = match launcher {
            0 => {
                let mut c = Command::new("sh");
                c.args(["-c", script]);
                c
            }
            1 => {
                let mut c = Command::new("bwrap");
                c.args(&self.bwrap).args(["sh", "-c", script]);
                c
            }
            _ => {
                let mut c = Command::new(&palisade);
                c.arg("run");
                match launcher {
                    2 => c.arg("--policy").arg(&self.policy),
                    _ => c.arg("--socket").arg(&self.daemon.socket),
                };
                c.args(["--profile", "build", "--", "sh", "-c", script]);
                c
            }
        };
        c.current_dir(&self.ws).env_clear().envs(self.env.iter().cloned());
        c.env("PALISADE_STATE", &self.state).env("PALISADE_JOURNAL", self.state.join("journal"));
        if launcher == 2 {
            c.env("PALISADE_LOG", "warn,palisade_broker::changes=debug");
        }
        c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        c
    }

    /// `script` by `launcher` on a fresh copy of `initial`: its seconds, and
    /// the embedded broker's settle timeline (capture, apply: µs).
    fn once(
        &self,
        launcher: usize,
        initial: &Path,
        script: &str,
    ) -> Result<(f64, Option<(u64, u64)>), String> {
        // The last run's workspace moved aside, removed once the work's
        // rounds are done: ext4 makes a file slowly right after many were
        // removed (it passes over their inodes), which would time the
        // removal and not the run.
        if self.ws.exists() {
            let aside =
                self.trash.join(format!("{}", std::fs::read_dir(&self.trash).map_or(0, |d| d.count())));
            std::fs::rename(&self.ws, aside).map_err(|e| format!("cannot move the workspace aside: {e}"))?;
        }
        let copied = Command::new("cp").arg("-a").arg(initial).arg(&self.ws).status();
        if !copied.is_ok_and(|s| s.success()) {
            return Err("cannot copy the workspace".into());
        }
        let start = Instant::now();
        let o = self.command(launcher, script).output().map_err(|e| e.to_string())?;
        let secs = start.elapsed().as_secs_f64();
        let err = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() {
            return Err(format!("{}: exit {:?}: {err}", LAUNCHERS[launcher], o.status.code()));
        }
        let field = |name: &str| -> Option<u64> {
            let line = err.lines().find(|l| l.contains("settle timeline"))?;
            let at = line.find(&format!("{name}="))? + name.len() + 1;
            line[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
        };
        Ok((secs, field("capture_us").zip(field("apply_us"))))
    }
}

/// bwrap's arguments: the system read-only, `ro` read-only, `ws` writable,
/// a private /tmp, /proc and /dev, every namespace but the network's own.
fn bwrap_args(ws: &Path, ro: &[&Path]) -> Vec<String> {
    let mut a: Vec<String> =
        ["--unshare-all", "--die-with-parent", "--new-session"].map(String::from).to_vec();
    for d in ["/usr", "/etc", "/lib", "/lib64", "/bin", "/sbin"] {
        if Path::new(d).exists() {
            a.extend(["--ro-bind".into(), d.into(), d.into()]);
        }
    }
    for p in ro {
        let p = p.to_string_lossy().into_owned();
        a.extend(["--ro-bind".into(), p.clone(), p]);
    }
    let ws = ws.to_string_lossy().into_owned();
    a.extend(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"].map(String::from));
    a.extend(["--bind".into(), ws.clone(), ws.clone(), "--chdir".into(), ws]);
    a
}

/// The section: each work by each launcher, `rounds` times.
pub fn builds(dir: &Path, rounds: usize) -> String {
    let mut out = String::from("### Real work: builds and installs\n\n");
    let base = dir.join("builds");
    let ws = base.join("ws");
    let o = Command::new("rustc").args(["--print", "sysroot"]).output();
    let sysroot = o.ok().map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let mut works: Vec<(Work, PathBuf)> = Vec::new();
    let mut skipped = Vec::new();
    let made = |name: &str, make: &dyn Fn(&Path) -> Result<Work, String>| {
        let initial = base.join(name);
        std::fs::create_dir_all(&initial).map_err(|e| e.to_string())?;
        make(&initial).map(|w| (w, initial))
    };
    let sys = sysroot.clone().unwrap_or_default();
    let cargo = |p: &Path| cargo_work(p, &sys);
    let files = |_: &Path| Ok(files_work());
    for (name, make) in [
        ("cargo", &cargo as &dyn Fn(&Path) -> Result<Work, String>),
        ("pip", &pip_work),
        ("npm", &npm_work),
        ("files", &files),
    ] {
        match made(name, make) {
            Ok(w) => works.push(w),
            Err(e) => skipped.push(format!("{name}: {e}")),
        }
    }
    let ro: Vec<&Path> = sysroot.iter().map(PathBuf::as_path).collect();
    let ro_list: Vec<String> = ro.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let profile = format!(
        "[profiles.build]\nread_only = {ro_list:?}\nallow_interpreters = true\nallow_inline_code = true\n\
         max_execution_time = 900\nmax_memory_mb = 4096\nmax_output_bytes = 1073741824\n"
    );
    let policy = base.join("policy.toml");
    let _ = std::fs::write(&policy, &profile);
    let has_bwrap = Command::new("bwrap").arg("--version").output().is_ok_and(|o| o.status.success());
    let runner = Runner {
        has_bwrap,
        bwrap: bwrap_args(&ws, &ro),
        policy,
        state: base.join("state"),
        trash: base.join("trash"),
        daemon: Daemon::start_with(&base, "builds", true, false, "", &profile),
        env: vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("HOME".into(), ws.join(".home").to_string_lossy().into_owned()),
            ("LANG".into(), "C.UTF-8".into()),
        ],
        ws,
    };
    let _ = std::fs::create_dir(&runner.trash);
    out.push_str(
        "| work | bare s | bwrap s (×) | palisade embedded s (×) | palisade daemon s (×) | capture ms | apply ms |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for (work, initial) in &works {
        let mut secs: Vec<Vec<f64>> = vec![vec![]; LAUNCHERS.len()];
        let (mut capture, mut apply) = (vec![], vec![]);
        let mut failed = None;
        for _ in 0..rounds {
            for (l, samples) in secs.iter_mut().enumerate() {
                if l == 1 && !runner.has_bwrap {
                    continue;
                }
                match runner.once(l, initial, &work.script) {
                    Ok((s, timeline)) => {
                        samples.push(s);
                        if let Some((c, a)) = timeline {
                            capture.push(c as f64 / 1e3);
                            apply.push(a as f64 / 1e3);
                        }
                    }
                    Err(e) => failed = Some(e),
                }
            }
        }
        let _ = Command::new("rm").arg("-rf").arg(&runner.trash).status();
        let _ = std::fs::create_dir(&runner.trash);
        if let Some(e) = failed {
            out.push_str(&format!("| {} | failed: {} |||||\n", work.name, e.lines().next().unwrap_or("")));
            continue;
        }
        for s in secs.iter_mut().chain([&mut capture, &mut apply]) {
            s.sort_by(f64::total_cmp);
        }
        let m: Vec<Option<f64>> = secs.iter().map(|s| (!s.is_empty()).then(|| percentile(s, 0.5))).collect();
        let ms = |s: &[f64]| if s.is_empty() { "-".into() } else { format!("{:.0}", percentile(s, 0.5)) };
        let bare = m[0].unwrap_or(f64::NAN);
        let cell =
            |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.2} ({:.2})", v / bare));
        out.push_str(&format!(
            "| {} | {bare:.2} | {} | {} | {} | {} | {} |\n",
            work.name,
            cell(m[1]),
            cell(m[2]),
            cell(m[3]),
            ms(&capture),
            ms(&apply)
        ));
    }
    for s in &skipped {
        out.push_str(&format!("\nNot measured: {s}\n"));
    }
    out.push_str(
        "\nEach palisade run's writes go to a layer on the store's filesystem and are applied when it \
         ends (moved into place where that is the workspace's filesystem). Capture: the layer walked, \
         each entry checked against the host and hashed; apply: each entry swapped in and checked. \
         The rest of a palisade run's time past bwrap's is the sandbox's set-up and the overlay.\n",
    );
    drop(runner);
    let _ = std::fs::remove_dir_all(&base);
    out
}
