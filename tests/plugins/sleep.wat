;; Placeholder test plugin (the palisade plugin ABI, docs/plugins.md): exports
;; `memory`, `palisade_alloc(len) -> ptr` and `palisade_plugin_main(ptr, len) -> i64`
;; returning (out_ptr << 32) | out_len; host functions are imported from
;; module `palisade` as (func (param i32 i32) (result i64)) over JSON bytes.
(module
  (import "palisade" "http_fetch" (func $http_fetch (param i32 i32) (result i64)))
  (memory (export "memory") 1)
  (global $next (mut i32) (i32.const 1024))
  (func $alloc (export "palisade_alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $next))
    (global.set $next (i32.add (local.get $ptr) (local.get $len)))
    ;; grow when the bump pointer passes the end of memory
    (if (i32.gt_u (global.get $next) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow
        (i32.add (i32.div_u (i32.sub (global.get $next) (i32.mul (memory.size) (i32.const 65536))) (i32.const 65536)) (i32.const 1))))))
    (local.get $ptr))
  (func $pack (param $ptr i32) (param $len i32) (result i64)
    (i64.or (i64.shl (i64.extend_i32_u (local.get $ptr)) (i64.const 32)) (i64.extend_i32_u (local.get $len))))
  (func (export "palisade_plugin_main") (param $ptr i32) (param $len i32) (result i64)
    ;; sleep: input {"url": U} of an origin that never answers: http_fetch waits past the deadline
    (call $http_fetch (local.get $ptr) (local.get $len))
  )
)
