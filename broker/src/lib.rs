//! The broker side of palisade: spawning the helper, and (in `palisaded` and
//! `palisade`) everything around it.

pub mod spawn;
