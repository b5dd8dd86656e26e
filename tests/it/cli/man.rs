//! The manual pages in `man/`: generated from the command line's definition
//! (`lease_sweeper::cli::Cli`, the same text `--help` prints), one page per
//! command and subcommand, and committed so the Debian package and a reader
//! of the repository get them without a build. The test fails when a
//! committed page differs from what the CLI generates now, and says how to
//! refresh them; it owns the rendering, not the text.
//!
//! The help texts' `HEADING:` blocks (OUTPUT, ENVIRONMENT, EXIT STATUS, …)
//! become sections of their own, set without filling so their columns stay
//! as `--help` shows them; a `DESCRIPTION:` block joins the page's
//! DESCRIPTION.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::CommandFactory as _;
use clap_mangen::Man;
use clap_mangen::roff::{Roff, roman};

/// Where the pages are committed.
const MAN_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/man");

/// Set to 1 to write the generated pages into `man/` instead of comparing.
const WRITE_VAR: &str = "LEASE_SWEEPER_WRITE_MAN";

/// The manual these pages belong to, in each page's header.
const MANUAL: &str = "lease-sweeper manual";

/// Every page: file name (`lease-sweeper-jobs-dry-run.1`) to its roff text.
fn pages() -> BTreeMap<String, String> {
    // As clap_mangen's own generate_to: no `help` subcommand pages.
    let mut root = lease_sweeper::cli::Cli::command().disable_help_subcommand(true);
    root.build();
    let mut out = BTreeMap::new();
    collect(&root, &mut out);
    out
}

fn collect(cmd: &clap::Command, out: &mut BTreeMap<String, String>) {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        collect(sub, out);
    }
    let name = cmd.get_display_name().unwrap_or(cmd.get_name()).to_owned();
    out.insert(format!("{name}.1"), page(cmd, &name));
}

/// One page: clap_mangen's sections, with its single EXTRA section (the
/// whole after-help text, filled into one paragraph) replaced by the help's
/// own headed blocks.
fn page(cmd: &clap::Command, name: &str) -> String {
    let man = Man::new(cmd.clone())
        .title(name.to_uppercase())
        .source(format!("lease-sweeper {}", env!("CARGO_PKG_VERSION")))
        .manual(MANUAL);
    let mut buf = Vec::new();
    man.render(&mut buf).expect("rendering into memory");
    let mut text = String::from_utf8(buf).expect("roff is UTF-8");

    let mut blocks = after_help_blocks(cmd);
    // In a manual, `lease-sweeper check` under SEE ALSO is the page
    // lease-sweeper-check(1).
    for (heading, body) in &mut blocks {
        if heading == "SEE ALSO" {
            for line in body.iter_mut() {
                *line = man_references(line);
            }
        }
    }
    if let Some(start) = text.find(".SH EXTRA\n") {
        let end = text[start + 1..]
            .find("\n.SH ")
            .map_or(text.len(), |i| start + 2 + i);
        let rest: Vec<(String, Vec<String>)> = blocks
            .iter()
            .filter(|(h, _)| h != "DESCRIPTION")
            .cloned()
            .collect();
        text.replace_range(start..end, &sections(&rest));
    }
    if let Some(pos) = blocks.iter().position(|(h, _)| h == "DESCRIPTION") {
        let (_, body) = blocks.remove(pos);
        let start = text
            .find(".SH DESCRIPTION\n")
            .expect("clap_mangen writes DESCRIPTION");
        let end = text[start + 1..]
            .find("\n.SH ")
            .map_or(text.len(), |i| start + 2 + i);
        let mut roff = Roff::new();
        roff.control("PP", []);
        preformatted(&mut roff, &body);
        text.insert_str(end, &without_preamble(&roff));
    }
    text
}

/// `lease-sweeper <subcommand>` written as that subcommand's page.
fn man_references(line: &str) -> String {
    let root = lease_sweeper::cli::Cli::command();
    let mut out = line.to_owned();
    for sub in root.get_subcommands() {
        let name = sub.get_name();
        out = out.replace(
            &format!("lease-sweeper {name},"),
            &format!("lease-sweeper-{name}(1),"),
        );
        if out.ends_with(&format!("lease-sweeper {name}")) {
            let cut = out.len() - name.len() - "lease-sweeper ".len();
            out.replace_range(cut.., &format!("lease-sweeper-{name}(1)"));
        }
        out = out.replace(
            &format!("lease-sweeper {name} "),
            &format!("lease-sweeper-{name}(1) "),
        );
    }
    out
}

/// The after-help text as (heading, lines) blocks. A heading is a line at
/// the left margin ending in `:` whose words before any parenthesis are
/// capitals (`EXIT STATUS:`); a parenthesis (`OUTPUT (stdout):`) becomes the
/// block's first line. The block's lines lose their two-space indent.
fn after_help_blocks(cmd: &clap::Command) -> Vec<(String, Vec<String>)> {
    let Some(help) = cmd.get_after_long_help().or(cmd.get_after_help()) else {
        return Vec::new();
    };
    let mut blocks: Vec<(String, Vec<String>)> = Vec::new();
    for line in help.to_string().lines() {
        if let Some((heading, note)) = heading(line) {
            blocks.push((heading, note.into_iter().collect()));
        } else if let Some((_, body)) = blocks.last_mut() {
            body.push(line.strip_prefix("  ").unwrap_or(line).to_owned());
        } else {
            blocks.push(("NOTES".to_owned(), vec![line.to_owned()]));
        }
    }
    for (_, body) in &mut blocks {
        while body.last().is_some_and(|l| l.trim().is_empty()) {
            body.pop();
        }
    }
    blocks
}

fn heading(line: &str) -> Option<(String, Option<String>)> {
    let text = line.strip_suffix(':').filter(|_| !line.starts_with(' '))?;
    let (caps, note) = match text.find(" (") {
        Some(i) => (&text[..i], Some(text[i + 1..].to_owned())),
        None => (text, None),
    };
    let is_heading = !caps.is_empty() && caps.chars().all(|c| c.is_ascii_uppercase() || c == ' ');
    is_heading.then(|| (caps.to_owned(), note))
}

fn sections(blocks: &[(String, Vec<String>)]) -> String {
    let mut roff = Roff::new();
    for (heading, body) in blocks {
        roff.control("SH", [heading.as_str()]);
        preformatted(&mut roff, body);
    }
    without_preamble(&roff)
}

/// Lines set as written (no filling, no hyphenation), as `--help` shows them.
fn preformatted(roff: &mut Roff, lines: &[String]) {
    roff.control("nf", []);
    for line in lines {
        roff.text([roman(line.as_str())]);
    }
    roff.control("fi", []);
}

/// `roff`'s text without the apostrophe preamble every rendering starts
/// with (the page already has one).
fn without_preamble(roff: &Roff) -> String {
    let preamble = Roff::new().render();
    roff.render()
        .strip_prefix(&preamble)
        .expect("every rendering starts with the preamble")
        .to_owned()
}

fn committed(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "1"))
                .map(|p| {
                    let name = p.file_name().unwrap().to_string_lossy().into_owned();
                    (name, std::fs::read_to_string(&p).unwrap_or_default())
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn committed_pages_match_the_cli() {
    let dir = PathBuf::from(MAN_DIR);
    let want = pages();
    assert!(
        want.contains_key("lease-sweeper.1") && want.contains_key("lease-sweeper-run.1"),
        "{:?}",
        want.keys()
    );
    if std::env::var(WRITE_VAR).is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(&dir).unwrap();
        for stale in committed(&dir).keys().filter(|k| !want.contains_key(*k)) {
            std::fs::remove_file(dir.join(stale)).unwrap();
        }
        for (name, text) in &want {
            std::fs::write(dir.join(name), text).unwrap();
        }
        return;
    }
    let have = committed(&dir);
    let mut wrong = Vec::new();
    for (name, text) in &want {
        match have.get(name) {
            None => wrong.push(format!("man/{name} is missing")),
            Some(t) if t != text => wrong.push(format!(
                "man/{name} differs from the page the command line generates"
            )),
            Some(_) => {}
        }
    }
    for name in have.keys().filter(|k| !want.contains_key(*k)) {
        wrong.push(format!("man/{name} belongs to no command"));
    }
    assert!(
        wrong.is_empty(),
        "{}\nThe pages are generated from src/cli.rs: refresh them with\n  \
         {WRITE_VAR}=1 cargo test --test it cli::man::\nand commit man/.",
        wrong.join("\n")
    );
}

#[test]
fn help_headings_become_sections() {
    let run = pages().remove("lease-sweeper-run.1").unwrap();
    for heading in [
        ".SH OUTPUT\n",
        ".SH METRICS\n",
        ".SH SIGNALS\n",
        ".SH SYSTEMD\n",
        ".SH EXAMPLES\n",
        ".SH ENVIRONMENT\n",
        ".SH \"EXIT STATUS\"\n",
        ".SH \"SEE ALSO\"\n",
    ] {
        assert!(run.contains(heading), "no {heading:?} in:\n{run}");
    }
    assert!(!run.contains(".SH EXTRA"), "{run}");
    // A line of the help, as roff writes it (`-` escaped).
    assert!(run.contains("lock.lease.expired:N|c|#backend:pg"), "{run}");
    let check = pages().remove("lease-sweeper-check.1").unwrap();
    assert_eq!(check.matches(".SH DESCRIPTION").count(), 1, "{check}");
    assert!(
        check.contains("statsd       STATSD_HOST resolves"),
        "{check}"
    );
}
