//! Every `spec §N` or `spec §N.M` citation in `src/` and `kernels/` must name a numbered heading
//! of `docs/recsplit.md`, the algorithm description the code follows.
//!
//! Why: comments cite sections of that document to justify constants, bit layouts and
//! invariants. A citation whose section does not exist (a typo, or a renumbered document) sends
//! the reader nowhere, and nothing else would notice. This test lists each such citation with
//! its file and line.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

#[test]
fn every_spec_citation_names_a_heading_of_the_algorithm_description() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc_path = root.join("docs/recsplit.md");
    let doc = fs::read_to_string(&doc_path).unwrap_or_else(|e| panic!("cannot read {}: {e}", doc_path.display()));
    let headings = heading_numbers(&doc);

    let mut files = Vec::new();
    for dir in ["src", "kernels"] {
        collect_files(&root.join(dir), &mut files);
    }
    files.sort();

    let mut found = 0;
    let mut unresolved = Vec::new();
    for file in &files {
        // Files that are not UTF-8 text are not source files.
        let Ok(text) = fs::read_to_string(file) else {
            continue;
        };
        let shown = file.strip_prefix(root).unwrap_or(file).display();
        for (i, line) in text.lines().enumerate() {
            for number in citations(line) {
                found += 1;
                if !headings.contains(number) {
                    unresolved.push(format!("  {shown}:{}: spec §{number}", i + 1));
                }
            }
        }
    }

    assert!(found > 0, "found no `spec §` citations under src/ and kernels/");
    assert!(
        unresolved.is_empty(),
        "{} of {found} `spec §` citations name no heading of docs/recsplit.md:\n{}",
        unresolved.len(),
        unresolved.join("\n")
    );
}

/// The section numbers cited in `line`: the `N` or `N.M…` after each `spec §`, without a
/// trailing '.' (the end of a sentence, not part of the number).
fn citations(line: &str) -> Vec<&str> {
    line.match_indices("spec §")
        .map(|(at, tag)| {
            let rest = &line[at + tag.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            rest[..end].trim_end_matches('.')
        })
        .filter(|number| !number.is_empty())
        .collect()
}

/// The numbers of the markdown headings of `doc` outside code blocks: `## 9. Query` gives "9",
/// `### 2.4 Limits` gives "2.4".
fn heading_numbers(doc: &str) -> BTreeSet<String> {
    let mut numbers = BTreeSet::new();
    let mut in_code_block = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            in_code_block = !in_code_block;
            continue;
        }
        if in_code_block || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#');
        let Some(first_word) = title.strip_prefix(' ').and_then(|t| t.split_whitespace().next()) else {
            continue;
        };
        let number = first_word.strip_suffix('.').unwrap_or(first_word);
        if is_section_number(number) {
            numbers.insert(number.to_string());
        }
    }
    numbers
}

/// True for `N`, `N.M`, `N.M.K`, …: non-empty runs of ASCII digits joined by single dots.
fn is_section_number(s: &str) -> bool {
    s.split('.')
        .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
}

/// All files below `dir`, recursively.
fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
            .path();
        if path.is_dir() {
            collect_files(&path, out);
        } else {
            out.push(path);
        }
    }
}
