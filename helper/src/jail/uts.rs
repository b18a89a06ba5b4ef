//! Host name inside the new UTS namespace.

use super::error::{Context, Result};
use palisade_protocol::Stage;

pub fn set_hostname(name: &str) -> Result<()> {
    nix::unistd::sethostname(name).at(Stage::Hostname, || format!("sethostname {name:?}"))
}
