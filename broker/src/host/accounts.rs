//! Users and groups by name, as the host knows them.

/// The host's users and groups by name (`/etc/passwd`, `/etc/group` and
/// whatever else NSS is set up to ask), for the names a configuration
/// gives where ids go (see [`palisade_policy::ids`]).
pub struct Accounts;

impl palisade_policy::ids::Accounts for Accounts {
    fn uid(&self, name: &str) -> Result<Option<u32>, String> {
        let user = nix::unistd::User::from_name(name).map_err(|e| e.to_string())?;
        Ok(user.map(|u| u.uid.as_raw()))
    }

    fn gid(&self, name: &str) -> Result<Option<u32>, String> {
        let group = nix::unistd::Group::from_name(name).map_err(|e| e.to_string())?;
        Ok(group.map(|g| g.gid.as_raw()))
    }
}

/// The user name of `uid`, where the host knows it (NSS may ask a
/// directory service: call it off the runtime's threads).
pub fn user_name(uid: u32) -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).ok().flatten().map(|u| u.name)
}
