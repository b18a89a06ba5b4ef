//! The skills index: `skills_dir/<name>/` holds an installed skill's
//! `skill.toml` and `module.wasm`; `skills_dir/.cache/` the modules
//! precompiled by the plugin-host (`cache.rs`); `skills_dir/.storage/` each
//! requester's storage (`store.rs`).

use palisade_policy::plugins::{Manifest, ManifestError};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

pub const MANIFEST_FILE: &str = "skill.toml";
pub const MODULE_FILE: &str = "module.wasm";
pub const CACHE_DIR: &str = ".cache";
/// Largest module the index takes (the channel's frame bounds it too).
pub const MAX_MODULE_BYTES: u64 = 8 << 20;
/// Largest manifest: a page of TOML.
const MAX_MANIFEST_BYTES: u64 = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("{path}: sha256 {actual} does not match the manifest's {expected}: refusing the module")]
    Mismatch { path: PathBuf, expected: String, actual: String },
    #[error("no skill {0:?} is installed (palisade plugin list)")]
    Unknown(String),
    #[error("{path}: {len} bytes exceeds {max}")]
    TooLarge { path: PathBuf, len: u64, max: u64 },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> IndexError + '_ {
    move |source| IndexError::Io { path: path.to_path_buf(), source }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads a file of at most `max` bytes.
fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, IndexError> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(io_at(path))?;
    let mut out = Vec::new();
    f.take(max + 1).read_to_end(&mut out).map_err(io_at(path))?;
    if out.len() as u64 > max {
        return Err(IndexError::TooLarge { path: path.into(), len: out.len() as u64, max });
    }
    Ok(out)
}

/// An installed skill: its manifest and its verified module.
pub struct Skill {
    pub manifest: Manifest,
    pub module: Vec<u8>,
}

pub struct Index {
    pub dir: PathBuf,
}

impl Index {
    pub fn cache_dir(&self) -> PathBuf {
        self.dir.join(CACHE_DIR)
    }

    fn manifest_at(path: &Path) -> Result<Manifest, IndexError> {
        let text = read_bounded(path, MAX_MANIFEST_BYTES)?;
        Ok(Manifest::parse(&String::from_utf8_lossy(&text), path)?)
    }

    fn verified(manifest: &Manifest, module_path: &Path) -> Result<Vec<u8>, IndexError> {
        let module = read_bounded(module_path, MAX_MODULE_BYTES)?;
        let actual = sha256_hex(&module);
        if actual != manifest.sha256 {
            return Err(IndexError::Mismatch {
                path: module_path.into(),
                expected: manifest.sha256.clone(),
                actual,
            });
        }
        Ok(module)
    }

    /// Installs the skill of the manifest at `manifest_path`: its module
    /// verified, both copied into `dir/<name>/` (replacing an older version).
    pub fn install(&self, manifest_path: &Path) -> Result<Manifest, IndexError> {
        let manifest = Self::manifest_at(manifest_path)?;
        let base = manifest_path.parent().unwrap_or(Path::new("."));
        let module = Self::verified(&manifest, &base.join(&manifest.module))?;
        let dest = self.dir.join(&manifest.name);
        std::fs::create_dir_all(&dest).map_err(io_at(&dest))?;
        let mut stored = manifest.clone();
        stored.module = PathBuf::from(MODULE_FILE);
        let text = toml::to_string(&stored).map_err(|e| io_at(&dest)(std::io::Error::other(e)))?;
        for (name, bytes) in [(MODULE_FILE, module.as_slice()), (MANIFEST_FILE, text.as_bytes())] {
            let tmp = dest.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, bytes).map_err(io_at(&tmp))?;
            std::fs::rename(&tmp, dest.join(name)).map_err(io_at(&dest))?;
        }
        Ok(stored)
    }

    /// An installed skill, its module verified against its manifest again.
    pub fn load(&self, name: &str) -> Result<Skill, IndexError> {
        if !palisade_policy::plugins::key_name(name) {
            return Err(IndexError::Unknown(name.into()));
        }
        let dir = self.dir.join(name);
        let manifest_path = dir.join(MANIFEST_FILE);
        if !manifest_path.is_file() {
            return Err(IndexError::Unknown(name.into()));
        }
        let manifest = Self::manifest_at(&manifest_path)?;
        let module = Self::verified(&manifest, &dir.join(&manifest.module))?;
        Ok(Skill { manifest, module })
    }

    /// Removes the installed skill `name`: its manifest, its module, and
    /// every requester's storage of it (a skill installed later under the
    /// name starts with none).
    pub fn remove(&self, name: &str) -> Result<(), IndexError> {
        if !palisade_policy::plugins::key_name(name) || !self.dir.join(name).join(MANIFEST_FILE).is_file() {
            return Err(IndexError::Unknown(name.into()));
        }
        let stores = self.dir.join(super::store::STORAGE_DIR);
        if let Ok(requesters) = std::fs::read_dir(&stores) {
            for requester in requesters {
                let store = requester.map_err(io_at(&stores))?.path().join(name);
                if std::fs::symlink_metadata(&store).is_ok() {
                    std::fs::remove_dir_all(&store).map_err(io_at(&store))?;
                }
            }
        }
        let dir = self.dir.join(name);
        std::fs::remove_dir_all(&dir).map_err(io_at(&dir))
    }

    /// The sha256 of every installed skill's module: what the module cache keeps.
    pub fn modules(&self) -> Result<std::collections::HashSet<String>, IndexError> {
        Ok(self.list()?.into_iter().map(|m| m.sha256).collect())
    }

    /// Every installed skill's manifest, by name.
    pub fn list(&self) -> Result<Vec<Manifest>, IndexError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(io_at(&self.dir)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = entry.map_err(io_at(&self.dir))?.path().join(MANIFEST_FILE);
            if path.is_file() {
                out.push(Self::manifest_at(&path)?);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_verifies_and_load_verifies_again() {
        let root = std::env::temp_dir().join(format!("palisade-index-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let src = root.join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("e.wat"), b"(module)").unwrap();
        let sha = sha256_hex(b"(module)");
        let manifest =
            |sha: &str| format!("name = \"echo\"\nversion = \"1\"\nmodule = \"e.wat\"\nsha256 = \"{sha}\"\n");
        std::fs::write(src.join("bad.toml"), manifest(&"0".repeat(64))).unwrap();
        std::fs::write(src.join("skill.toml"), manifest(&sha)).unwrap();
        let index = Index { dir: root.join("skills") };
        assert!(matches!(index.install(&src.join("bad.toml")), Err(IndexError::Mismatch { .. })));
        assert!(index.list().unwrap().is_empty());
        index.install(&src.join("skill.toml")).unwrap();
        assert_eq!(index.list().unwrap()[0].name, "echo");
        assert_eq!(index.load("echo").unwrap().module, b"(module)");
        assert!(matches!(index.load("other"), Err(IndexError::Unknown(_))));
        assert_eq!(index.modules().unwrap(), [sha.clone()].into());
        std::fs::write(index.dir.join("echo").join(MODULE_FILE), b"(module )").unwrap();
        assert!(matches!(index.load("echo"), Err(IndexError::Mismatch { .. })));
        let store = index.dir.join(super::super::store::STORAGE_DIR).join("1000");
        std::fs::create_dir_all(store.join("echo")).unwrap();
        std::fs::create_dir_all(store.join("other")).unwrap();
        assert!(matches!(index.remove("../skills"), Err(IndexError::Unknown(_))));
        index.remove("echo").unwrap();
        assert!(
            index.list().unwrap().is_empty() && !store.join("echo").exists() && store.join("other").exists()
        );
        assert!(matches!(index.remove("echo"), Err(IndexError::Unknown(_))));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
