//! Links libmoeep and, for the layout test, measures the C header's structs.
//!
//! The library: MOEEP_LIB_DIR, else the repository's build/lib (this crate
//! lives in bindings/rust/moeep-sys), else the libdir of `pkg-config moeep`.
//! The header: MOEEP_INCLUDE_DIR, else the repository's include/.
//!
//! Every `typedef struct { ... } NAME;` of moeep.h is read (field names
//! only), a C program printing each struct's size and each field's offset
//! and size is written,
//! compiled with $CC (else cc) and run; its table goes to
//! $OUT_DIR/c_layout.rs, which tests/layout.rs compares with the Rust
//! structs. So the comparison is always against the header being built
//! against, never against a copy of it.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let repo = manifest.join("../../..");
    for var in ["MOEEP_LIB_DIR", "MOEEP_INCLUDE_DIR", "CC"] {
        println!("cargo:rerun-if-env-changed={}", var);
    }

    let lib_dir = env::var("MOEEP_LIB_DIR").map(PathBuf::from).ok().or_else(|| {
        let built = repo.join("build/lib");
        if built.join("libmoeep.so").exists() {
            Some(built)
        } else {
            pkg_config_libdir()
        }
    });
    match lib_dir {
        Some(dir) => println!("cargo:rustc-link-search=native={}", dir.display()),
        None => println!("cargo:warning=libmoeep not found (set MOEEP_LIB_DIR); linking may fail"),
    }
    println!("cargo:rustc-link-lib=dylib=moeep");

    let include = env::var("MOEEP_INCLUDE_DIR").map(PathBuf::from).unwrap_or_else(|_| repo.join("include"));
    let header = include.join("moeep.h");
    println!("cargo:rerun-if-changed={}", header.display());
    let text = fs::read_to_string(&header).unwrap_or_else(|e| panic!("cannot read {}: {}", header.display(), e));
    let structs = parse_structs(&strip_comments(&text));
    assert!(!structs.is_empty(), "no struct found in {}", header.display());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let table = measure(&structs, &include, &out);
    fs::write(out.join("c_layout.rs"), table).unwrap();
}

fn pkg_config_libdir() -> Option<PathBuf> {
    let out = Command::new("pkg-config").args(["--variable=libdir", "moeep"]).output().ok()?;
    let dir = String::from_utf8(out.stdout).ok()?.trim().to_string();
    if out.status.success() && !dir.is_empty() {
        Some(PathBuf::from(dir))
    } else {
        None
    }
}

fn strip_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map(|i| &after[i + 2..]).unwrap_or("");
        } else if rest.starts_with("//") {
            rest = rest.find('\n').map(|i| &rest[i..]).unwrap_or("");
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// (struct name, field names in order) of every `typedef struct { ... } NAME;`.
fn parse_structs(text: &str) -> Vec<(String, Vec<String>)> {
    let mut structs = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("typedef struct {") {
        let body_start = start + "typedef struct {".len();
        let close = rest[body_start..].find('}').expect("unterminated struct") + body_start;
        let semi = rest[close..].find(';').expect("struct without a name") + close;
        let name = rest[close + 1..semi].trim().to_string();
        let fields = rest[body_start..close]
            .split(';')
            .map(str::trim)
            .filter(|decl| !decl.is_empty())
            .map(|decl| {
                let decl = decl.split('[').next().unwrap(); // char internal[EP_UNIQUE_ID_BYTES]
                let ident: String = decl.chars().rev().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                ident.chars().rev().collect()
            })
            .collect();
        structs.push((name, fields));
        rest = &rest[semi..];
    }
    structs
}

fn measure(structs: &[(String, Vec<String>)], include: &Path, out: &Path) -> String {
    let mut c = String::from("#include <stddef.h>\n#include <stdio.h>\n#include \"moeep.h\"\nint main(void) {\n");
    for (name, fields) in structs {
        c += &format!("  printf(\"S {} %zu\\n\", sizeof({}));\n", name, name);
        for f in fields {
            c += &format!(
                "  printf(\"F {} %zu %zu\\n\", offsetof({}, {}), sizeof((({} *)0)->{}));\n",
                f, name, f, name, f
            );
        }
    }
    c += "  return 0;\n}\n";
    let src = out.join("c_layout.c");
    let exe = out.join("c_layout");
    fs::write(&src, c).unwrap();
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&cc)
        .arg("-std=c11")
        .arg("-I")
        .arg(include)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {}: {}", cc, e));
    assert!(status.success(), "{} failed on the generated {}", cc, src.display());
    let run = Command::new(&exe).output().expect("cannot run the layout program");
    assert!(run.status.success(), "the layout program failed");
    let mut table = String::from("/// (struct, sizeof, [(field, offsetof, sizeof)]) as the C compiler lays out moeep.h.\n");
    table += "pub const C_LAYOUT: &[(&str, usize, &[(&str, usize, usize)])] = &[\n";
    let mut open = false;
    for line in String::from_utf8(run.stdout).unwrap().lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["S", name, size] => {
                if open {
                    table += "]),\n";
                }
                table += &format!("    (\"{}\", {}, &[", name, size);
                open = true;
            }
            ["F", field, offset, size] => table += &format!("(\"{}\", {}, {}), ", field, offset, size),
            _ => panic!("unexpected line from the layout program: {}", line),
        }
    }
    if open {
        table += "]),\n";
    }
    table + "];\n"
}
