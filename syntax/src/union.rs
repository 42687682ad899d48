use crate::model::Spec;

/// One spec serving the clients of every given version: the newest version's types and
/// constants, and every function any of them declares, with the newest declaration of each.
pub fn union_of(specs: &[Spec]) -> Option<Spec> {
    let mut by_age: Vec<&Spec> = specs.iter().collect();
    by_age.sort_by_key(|s| std::cmp::Reverse(s.version));
    let newest = *by_age.first()?;
    let mut union = newest.clone();
    for older in &by_age[1..] {
        for f in &older.functions {
            if union.function(&f.name).is_none() {
                union.functions.push(f.clone());
            }
        }
    }
    Some(union)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_spec;

    fn spec(minor: u32, fns: &str) -> Spec {
        parse_spec(&format!(
            "pub const NCCL_MAJOR: u32 = 2; pub const NCCL_MINOR: u32 = {minor}; pub const NCCL_PATCH: u32 = 1;
             pub type ncclResult_t = u32;
             unsafe extern \"C\" {{ {fns} }}"
        ))
        .unwrap()
    }

    #[test]
    fn keeps_every_function_and_the_newest_signature() {
        let old = spec(
            26,
            "pub fn ncclGone() -> ncclResult_t; pub fn ncclF(a: i32) -> ncclResult_t;",
        );
        let new = spec(
            28,
            "pub fn ncclF(a: i64) -> ncclResult_t; pub fn ncclNew() -> ncclResult_t;",
        );
        let u = union_of(&[old, new]).unwrap();
        assert_eq!(u.version.minor, 28);
        let mut names: Vec<&str> = u.functions.iter().map(|f| f.name.as_str()).collect();
        names.sort();
        assert_eq!(names, ["ncclF", "ncclGone", "ncclNew"]);
        assert_eq!(
            u.function("ncclF").unwrap().signature(),
            "ncclF(a: i64) -> ncclResult_t"
        );
        assert!(union_of(&[]).is_none());
    }
}
