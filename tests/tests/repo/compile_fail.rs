//! The rules the compiler enforces, each proven by a program that must not compile, checked
//! against the compiler's exact output (`tests/compile_fail/*.stderr`), so that a proof cannot
//! pass for another reason. `TRYBUILD=overwrite cargo test --test repo compile_fail` rewrites
//! the expected output after a deliberate change (then read the diff).

#[test]
fn ownership_rules_are_compile_errors() {
    trybuild::TestCases::new().compile_fail("compile_fail/*.rs");
}
