;; storage: entry `palisade_plugin_main` calls `storage_put` (input
;; {"key","value"}) and then `storage_get` with the same input (the value
;; read back), or only `storage_get` when the input starts `{"get"` (input
;; {"get":1,"key"}); entry `get` calls `storage_get` (input {"key"}); each
;; returns {"ok":REPLY} or {"error":{"kind","message"}}.
(module
  (import "palisade" "storage_put" (func $put (param i32 i32) (result i64)))
  (import "palisade" "storage_get" (func $get (param i32 i32) (result i64)))
  (memory (export "memory") 1)
  ;; A bump allocator: never frees (an instance lives for one call), grows the
  ;; memory when an allocation passes its end, traps if it cannot.
  (global $bump (mut i32) (i32.const 1024))
  (func $alloc (export "palisade_alloc") (param $len i32) (result i32)
    (local $p i32) (local $end i32)
    (local.set $p (global.get $bump))
    (local.set $end (i32.add (local.get $p) (local.get $len)))
    (if (i32.gt_u (local.get $end) (i32.mul (memory.size) (i32.const 65536)))
      (then
        (if (i32.eq
              (memory.grow (i32.sub (i32.shr_u (i32.add (local.get $end) (i32.const 65535)) (i32.const 16))
                                    (memory.size)))
              (i32.const -1))
          (then unreachable))))
    (global.set $bump (local.get $end))
    (local.get $p))
  ;; Wraps a host function's result as the output: {"ok":REPLY} on success,
  ;; {"error":{"kind","message"}} on failure (bit 63 set).
  (data (i32.const 16) "{\"ok\":")
  (data (i32.const 32) "{\"error\":")
  (func $wrap (param $r i64) (result i64)
    (local $ptr i32) (local $len i32) (local $pre i32) (local $prelen i32) (local $out i32) (local $total i32)
    (if (i64.lt_s (local.get $r) (i64.const 0))
      (then
        (local.set $pre (i32.const 32)) (local.set $prelen (i32.const 9))
        (local.set $r (i64.and (local.get $r) (i64.const 0x7fffffffffffffff))))
      (else (local.set $pre (i32.const 16)) (local.set $prelen (i32.const 6))))
    (local.set $ptr (i32.wrap_i64 (i64.shr_u (local.get $r) (i64.const 32))))
    (local.set $len (i32.wrap_i64 (local.get $r)))
    (local.set $total (i32.add (i32.add (local.get $prelen) (local.get $len)) (i32.const 1)))
    (local.set $out (call $alloc (local.get $total)))
    (memory.copy (local.get $out) (local.get $pre) (local.get $prelen))
    (memory.copy (i32.add (local.get $out) (local.get $prelen)) (local.get $ptr) (local.get $len))
    (i32.store8 (i32.sub (i32.add (local.get $out) (local.get $total)) (i32.const 1)) (i32.const 125))
    (i64.or (i64.shl (i64.extend_i32_u (local.get $out)) (i64.const 32)) (i64.extend_i32_u (local.get $total))))
  ;; put, then (when it worked) get with the same input: the value read back;
  ;; only get when the input's third byte is the `g` of `{"get"`.
  (func (export "palisade_plugin_main") (param $ptr i32) (param $len i32) (result i64)
    (local $r i64)
    (if (i32.and (i32.gt_u (local.get $len) (i32.const 2))
                 (i32.eq (i32.load8_u (i32.add (local.get $ptr) (i32.const 2))) (i32.const 103)))
      (then (return (call $wrap (call $get (local.get $ptr) (local.get $len))))))
    (local.set $r (call $put (local.get $ptr) (local.get $len)))
    (if (i64.lt_s (local.get $r) (i64.const 0)) (then (return (call $wrap (local.get $r)))))
    (call $wrap (call $get (local.get $ptr) (local.get $len))))
  (func (export "get") (param $ptr i32) (param $len i32) (result i64)
    (call $wrap (call $get (local.get $ptr) (local.get $len)))))
