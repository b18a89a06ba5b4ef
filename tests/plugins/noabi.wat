;; noabi: a valid module that does not follow the ABI (no palisade_alloc):
;; the host's Compile answers Failed.
(module
  (memory (export "memory") 1)
  (func (export "palisade_plugin_main") (param i32 i32) (result i64) (i64.const 0)))
