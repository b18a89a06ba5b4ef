;; loop: never returns; ends QuotaExceeded when its fuel runs out, or at
;; its deadline when the fuel budget is larger than the deadline allows.
;; Input: ignored.
(module
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
  (func (export "palisade_plugin_main") (param i32 i32) (result i64)
    (loop $forever (br $forever))
    (i64.const 0)))
