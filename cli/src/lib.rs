//! What `lladac` and `llada-rt` share around their `main`: command-line errors as one line
//! with the usage exit status.

use std::fmt::Display;
use std::process::ExitCode;

use clap::Parser;

/// Parses the command line of `program`. `--help` and `--version` print and end with success;
/// a usage error prints clap's error line (and its tip) as one line and ends with status 2.
pub fn parse<C: Parser>(program: &str) -> Result<C, ExitCode> {
    match C::try_parse() {
        Ok(cli) => Ok(cli),
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{}", one_line(&e.render().to_string(), program));
            Err(ExitCode::from(2))
        }
    }
}

/// A command's `main`: parses the command line of `program` (see [`parse`]), runs it, and
/// prints an error as `error: ...`, ending with status 2 where `usage` says the error is the
/// caller's (a setting out of range), 1 otherwise.
pub fn main<C: Parser, E: Display>(program: &str, run: impl FnOnce(C) -> Result<(), E>, usage: impl Fn(&E) -> bool) -> ExitCode {
    let cli = match parse::<C>(program) {
        Ok(cli) => cli,
        Err(status) => return status,
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            if usage(&e) { ExitCode::from(2) } else { ExitCode::FAILURE }
        }
    }
}

/// Clap's rendered error as one line: its error line, its tip if any, and where help is.
fn one_line(text: &str, program: &str) -> String {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let first = lines.next().unwrap_or("error: invalid arguments");
    let tip = lines.find(|l| l.trim_start().starts_with("tip:")).map(|t| format!(" ({})", t.trim())).unwrap_or_default();
    format!("{first}{tip}; see {program} --help")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_and_its_tip_become_one_line() {
        let text = "error: unexpected argument '--gen' found\n\n  tip: a similar argument exists: '--gen-len'\n\nUsage: llada-rt run <FILE>\n";
        assert_eq!(one_line(text, "llada-rt"), "error: unexpected argument '--gen' found (tip: a similar argument exists: '--gen-len'); see llada-rt --help");
        assert_eq!(one_line("", "lladac"), "error: invalid arguments; see lladac --help");
    }
}
