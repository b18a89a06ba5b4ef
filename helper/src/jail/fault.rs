//! A test hook of debug builds; a release build compiles it to nothing.
//! With `PALISADE_HELPER_FAULT=STAGE` in the helper's environment (which
//! the broker's own hook passes on), the helper stops once that stage of
//! its order is done, named `fault-STAGE`, until something kills it: the
//! fault tests kill it there from outside, as the OOM killer or an operator
//! might.

use palisade_protocol::Stage;

pub fn stop_after(stage: Stage) {
    let asked = std::env::var("PALISADE_HELPER_FAULT").ok();
    if !cfg!(debug_assertions) || asked.as_deref() != Some(stage.name()) {
        return;
    }
    if let Ok(name) = std::ffi::CString::new(format!("fault-{}", stage.name())) {
        let _ = nix::sys::prctl::set_name(&name);
    }
    loop {
        nix::unistd::pause();
    }
}
