//! Users and groups as the configuration names them: by number, or by name
//! (`allowed_uids = ["alice", 1001]`, `allowed_gids = ["palisade"]`, the
//! approvers' `uids` and `gids`). A name is looked up by the broker when it
//! loads the file, through [`Accounts`]: this crate reads nothing of the
//! host's users and groups itself.

use super::{Config, ConfigError, line_column};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use std::fmt;
use toml::Spanned;

/// A user or a group: its number, or its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdOrName {
    Id(u32),
    Name(String),
}

impl fmt::Display for IdOrName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdOrName::Id(n) => write!(f, "{n}"),
            IdOrName::Name(s) => write!(f, "{s:?}"),
        }
    }
}

/// A list of users or groups, each with where the file says it.
pub type IdList = Vec<Spanned<IdOrName>>;

/// Whether `name` can be a user's or group's name: not empty, and none of
/// what no name holds (`:` separates the fields of `/etc/passwd`).
fn is_name(name: &str) -> bool {
    !name.is_empty() && !name.chars().any(|c| c == ':' || c.is_whitespace() || c.is_control())
}

impl<'de> Deserialize<'de> for IdOrName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<IdOrName, D::Error> {
        struct Either;
        impl Visitor<'_> for Either {
            type Value = IdOrName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a uid or gid (a number from 0 to 4294967295) or a user or group name (a string)")
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<IdOrName, E> {
                u32::try_from(n).map(IdOrName::Id).map_err(|_| E::custom(format!("{n} is not a uid or gid")))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<IdOrName, E> {
                u32::try_from(n).map(IdOrName::Id).map_err(|_| E::custom(format!("{n} is not a uid or gid")))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<IdOrName, E> {
                if is_name(s) {
                    Ok(IdOrName::Name(s.to_string()))
                } else {
                    Err(E::custom(format!("{s:?} is not a user or group name")))
                }
            }
        }
        deserializer.deserialize_any(Either)
    }
}

/// The host's users and groups, by name (the broker's: `/etc/passwd`,
/// `/etc/group`, NSS). `Ok(None)`: there is none of that name.
pub trait Accounts {
    fn uid(&self, name: &str) -> Result<Option<u32>, String>;
    fn gid(&self, name: &str) -> Result<Option<u32>, String>;
}

/// The users and groups the configuration names, as numbers, in its order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvedIds {
    /// `[broker] allowed_uids`.
    pub allowed_uids: Vec<u32>,
    /// `[broker] allowed_gids`: a peer whose primary or any supplementary group is one of these.
    pub allowed_gids: Vec<u32>,
    /// `[approvers] uids`.
    pub approver_uids: Vec<u32>,
    /// `[approvers] gids`.
    pub approver_gids: Vec<u32>,
    /// `[journal] reader_gid`.
    pub journal_reader_gid: Option<u32>,
}

impl Config {
    /// Every user and group the configuration names, as a number: a name
    /// is looked up in `accounts`, and one that names nobody is an error
    /// giving the key, the name, and its line and column in the file.
    pub fn resolve_ids(&self, accounts: &dyn Accounts) -> Result<ResolvedIds, ConfigError> {
        let user = |n: &str| accounts.uid(n);
        let group = |n: &str| accounts.gid(n);
        Ok(ResolvedIds {
            allowed_uids: self.resolve("broker.allowed_uids", "user", &self.broker.allowed_uids, &user)?,
            allowed_gids: self.resolve("broker.allowed_gids", "group", &self.broker.allowed_gids, &group)?,
            approver_uids: self.resolve("approvers.uids", "user", &self.approvers.uids, &user)?,
            approver_gids: self.resolve("approvers.gids", "group", &self.approvers.gids, &group)?,
            journal_reader_gid: self.journal_reader_gid(accounts)?,
        })
    }

    /// `[journal] reader_gid` as a number (a name looked up in `accounts`).
    pub fn journal_reader_gid(&self, accounts: &dyn Accounts) -> Result<Option<u32>, ConfigError> {
        let Some(gid) = &self.journal.reader_gid else { return Ok(None) };
        let group = |n: &str| accounts.gid(n);
        let one = self.resolve("journal.reader_gid", "group", std::slice::from_ref(gid), &group)?;
        Ok(one.first().copied())
    }

    fn resolve(
        &self,
        key: &str,
        kind: &str,
        list: &[Spanned<IdOrName>],
        lookup: &dyn Fn(&str) -> Result<Option<u32>, String>,
    ) -> Result<Vec<u32>, ConfigError> {
        let at = |offset: usize, message: String| {
            let (line, column) = line_column(self.text(), offset);
            let path = self.source.clone().unwrap_or_else(|| "built-in".into());
            ConfigError::Invalid { path, line, column, message }
        };
        let mut ids = Vec::with_capacity(list.len());
        for item in list {
            let id = match item.get_ref() {
                IdOrName::Id(n) => *n,
                IdOrName::Name(name) => match lookup(name) {
                    Ok(Some(n)) => n,
                    Ok(None) => {
                        return Err(at(
                            item.span().start,
                            format!("{key}: no {kind} named {name:?} on this host"),
                        ));
                    }
                    Err(e) => {
                        return Err(at(
                            item.span().start,
                            format!("{key}: cannot look up {kind} {name:?}: {e}"),
                        ));
                    }
                },
            };
            ids.push(id);
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    struct Host;
    impl Accounts for Host {
        fn uid(&self, name: &str) -> Result<Option<u32>, String> {
            Ok(match name {
                "alice" => Some(1001),
                "bob" => Some(1002),
                _ => None,
            })
        }
        fn gid(&self, name: &str) -> Result<Option<u32>, String> {
            match name {
                "palisade" => Ok(Some(990)),
                "broken" => Err("the directory service is down".into()),
                _ => Ok(None),
            }
        }
    }

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("p.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn names_and_numbers_are_taken_wherever_ids_are() {
        let c = parse(
            "[broker]\nallowed_uids = [\"alice\", 1003]\nallowed_gids = [\"palisade\", 5]\n\
             [approvers]\nuids = [\"bob\"]\ngids = [\"palisade\"]\n",
        )
        .unwrap();
        let ids = c.resolve_ids(&Host).unwrap();
        assert_eq!(
            ids,
            ResolvedIds {
                allowed_uids: vec![1001, 1003],
                allowed_gids: vec![990, 5],
                approver_uids: vec![1002],
                approver_gids: vec![990],
                journal_reader_gid: None,
            }
        );
        assert_eq!(parse("").unwrap().resolve_ids(&Host).unwrap(), ResolvedIds::default());
    }

    #[test]
    fn the_journals_reader_group_is_named_or_numbered() {
        let c = parse("[journal]\nreader_gid = \"palisade\"\n").unwrap();
        assert_eq!(c.resolve_ids(&Host).unwrap().journal_reader_gid, Some(990));
        let c = parse("[journal]\nreader_gid = 7\n").unwrap();
        assert_eq!(c.journal_reader_gid(&Host).unwrap(), Some(7));
        let c = parse("[journal]\n\nreader_gid = \"auditors\"\n").unwrap();
        let e = c.resolve_ids(&Host).unwrap_err().to_string();
        assert_eq!(e, "p.toml:3:14: journal.reader_gid: no group named \"auditors\" on this host");
    }

    #[test]
    fn a_name_of_nobody_is_refused_with_its_key_and_line() {
        let c = parse("[broker]\nallowed_uids = [0]\n\nallowed_gids = [5, \"palisdae\"]\n").unwrap();
        let e = c.resolve_ids(&Host).unwrap_err().to_string();
        assert_eq!(e, "p.toml:4:20: broker.allowed_gids: no group named \"palisdae\" on this host");
        let c = parse("[approvers]\nuids = [\"carol\"]\n").unwrap();
        let e = c.resolve_ids(&Host).unwrap_err().to_string();
        assert_eq!(e, "p.toml:2:9: approvers.uids: no user named \"carol\" on this host");
        let c = parse("[approvers]\ngids = [\"broken\"]\n").unwrap();
        let e = c.resolve_ids(&Host).unwrap_err().to_string();
        assert!(e.contains("cannot look up group \"broken\": the directory service is down"), "{e}");
    }

    #[test]
    fn what_is_neither_an_id_nor_a_name_is_refused_as_the_file_is_read() {
        for (text, want) in [
            ("[broker]\nallowed_uids = [-1]\n", "p.toml:2:17: -1 is not a uid or gid"),
            ("[broker]\nallowed_uids = [4294967296]\n", "p.toml:2:17: 4294967296 is not a uid or gid"),
            ("[broker]\nallowed_gids = [\"\"]\n", "p.toml:2:17: \"\" is not a user or group name"),
            ("[approvers]\ngids = [\"a b\"]\n", "p.toml:2:9: \"a b\" is not a user or group name"),
            ("[approvers]\nuids = [\"a:b\"]\n", "p.toml:2:9: \"a:b\" is not a user or group name"),
            ("[approvers]\nuids = [1.5]\n", "p.toml:2:9: invalid type: floating point"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.starts_with(want), "{text}: {e}");
        }
    }
}
