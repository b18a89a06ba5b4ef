;; malformed: fails validation (the entry point returns an i32 where its type says i64)
(module (func (export "palisade_plugin_main") (result i64) i32.const 1))
