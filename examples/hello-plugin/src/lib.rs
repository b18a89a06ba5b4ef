//! hello-plugin: the palisade plugin ABI (docs/plugins.md) in Rust, with no
//! dependencies. Input `{"name": "..."}`; it logs one line through the host
//! function `log` and returns `{"greeting": "hello, NAME"}`.
//!
//! Build: `cargo build --release --target wasm32-unknown-unknown`.

#[link(wasm_import_module = "palisade")]
unsafe extern "C" {
    /// `log({"level","message"}) -> {}`; the result packs a (pointer,
    /// length) pair, bit 63 set when it is an error's JSON.
    #[link_name = "log"]
    fn palisade_log(args_ptr: i32, args_len: i32) -> i64;
}

/// The ABI's allocator. Nothing is ever freed: an instance lives for one call.
#[unsafe(no_mangle)]
pub extern "C" fn palisade_alloc(len: i32) -> i32 {
    let buf = vec![0u8; len.max(0) as usize].into_boxed_slice();
    Box::leak(buf).as_mut_ptr() as i32
}

/// The entry point: `(input_ptr, input_len) -> (output_ptr << 32) | output_len`.
#[unsafe(no_mangle)]
pub extern "C" fn palisade_plugin_main(ptr: i32, len: i32) -> i64 {
    // SAFETY: the host wrote `len` bytes of input at `ptr`, which it got
    // from `palisade_alloc`: a live allocation of this module's memory.
    let input = unsafe { std::slice::from_raw_parts(ptr as *const u8, len as usize) };
    let name = string_field(input, "name").unwrap_or("world");
    let line = format!(r#"{{"level":"info","message":"greeting {}"}}"#, escape(name));
    // SAFETY: `line` is alive across the call; the host only reads it.
    let logged = unsafe { palisade_log(line.as_ptr() as i32, line.len() as i32) };
    let note = if logged < 0 { r#","log":"refused""# } else { "" };
    let output = format!(r#"{{"greeting":"hello, {}"{note}}}"#, escape(name));
    let output = Box::leak(output.into_bytes().into_boxed_slice());
    ((output.as_ptr() as i64) << 32) | output.len() as i64
}

/// The string value of `"field":"..."` in flat JSON without escapes: enough
/// for an example that has no JSON parser.
fn string_field<'a>(json: &'a [u8], field: &str) -> Option<&'a str> {
    let text = std::str::from_utf8(json).ok()?;
    let key = format!("\"{field}\"");
    let rest = text[text.find(&key)? + key.len()..].trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    Some(&rest[..rest.find('"')?])
}

/// Leaves only characters that need no escaping in a JSON string.
fn escape(s: &str) -> String {
    s.chars().filter(|c| *c != '"' && *c != '\\' && !c.is_control()).collect()
}
