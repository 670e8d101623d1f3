//! What `lladac` and `llada-rt` share around their `main`: command-line errors as one line
//! with the usage exit status, and stdout written fallibly (a closed or full stdout ends the
//! command with a word or quietly, never with a panic).

use std::fmt::{self, Display};
use std::io::{self, Write};
use std::process::ExitCode;

use clap::{ArgMatches, CommandFactory, FromArgMatches};

/// Why a command failed: its own error, a usage error found after parsing (a flag that does
/// nothing in this combination), or stdout refusing what it printed.
pub enum Failure<E> {
    Error(E),
    /// The caller's mistake, as clap's own errors: one line, exit status 2.
    Usage(String),
    /// Writing to stdout failed: a closed pipe (the reader had enough, as `head` does) ends
    /// the command quietly with success; anything else (a full disk) is an error.
    Stdout(io::Error),
}

impl<E> From<E> for Failure<E> {
    fn from(e: E) -> Self {
        Failure::Error(e)
    }
}

/// Writes `args` (and a newline if `newline`) to stdout and flushes, so that a failure shows
/// here, where it can be handled, rather than in a later write or at exit.
pub fn print_stdout(args: fmt::Arguments, newline: bool) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)?;
    if newline {
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// [`print_stdout`] as a command's [`Failure`].
pub fn write_stdout<E>(args: fmt::Arguments, newline: bool) -> Result<(), Failure<E>> {
    print_stdout(args, newline).map_err(Failure::Stdout)
}

/// `print!` that returns `Result<(), Failure<E>>` instead of panicking when stdout fails.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::write_stdout(::std::format_args!($($arg)*), false) };
}

/// `println!` that returns `Result<(), Failure<E>>` instead of panicking when stdout fails.
#[macro_export]
macro_rules! outln {
    () => { $crate::write_stdout(::std::format_args!(""), true) };
    ($($arg:tt)*) => { $crate::write_stdout(::std::format_args!($($arg)*), true) };
}

/// Parses the command line of `program`, returning the parsed command and clap's matches
/// (which say whether each flag was typed or took its default). `--help` and `--version`
/// print and end with success; a usage error prints clap's error (its missing arguments and
/// its tip included) as one line and ends with status 2.
pub fn parse<C: FromArgMatches + CommandFactory>(program: &str) -> Result<(C, ArgMatches), ExitCode> {
    let parsed = C::command().try_get_matches().and_then(|m| {
        let mut taken = m.clone();
        C::from_arg_matches_mut(&mut taken).map(|c| (c, m)).map_err(|e| e.format(&mut C::command()))
    });
    match parsed {
        Ok(p) => Ok(p),
        Err(e) if !e.use_stderr() => {
            // `--help | head`: a closed stdout is no error.
            let _ = e.print();
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            error_line(&one_line(&e.render().to_string(), program));
            Err(ExitCode::from(2))
        }
    }
}

/// Whether the argument `id` of the subcommand in `matches` was typed on the command line,
/// not left at its default (clap's value source): what both commands' "this flag does
/// nothing here" refusals ask.
pub fn typed(matches: &ArgMatches, id: &str) -> bool {
    matches.subcommand().is_some_and(|(_, m)| m.try_contains_id(id).is_ok() && m.value_source(id) == Some(clap::parser::ValueSource::CommandLine))
}

/// A command's `main`: parses the command line of `program` (see [`parse`]), runs it, and
/// prints an error as `error: ...`, ending with status 2 for a [`Failure::Usage`] or where
/// `usage` says the error is the caller's (a setting out of range), 1 otherwise. A closed
/// stdout ends it quietly with success (what Unix tools killed by SIGPIPE do, without the
/// signal's status: the reader stopped reading, nothing went wrong); another stdout error is
/// `error: writing to stdout: ...` and status 1.
pub fn main<C: FromArgMatches + CommandFactory, E: Display>(program: &str, run: impl FnOnce(C, &ArgMatches) -> Result<(), Failure<E>>, usage: impl Fn(&E) -> bool) -> ExitCode {
    let (cli, matches) = match parse::<C>(program) {
        Ok(parsed) => parsed,
        Err(status) => return status,
    };
    match run(cli, &matches) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Stdout(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(Failure::Stdout(e)) => {
            error_line(&format!("error: writing to stdout: {e}"));
            ExitCode::FAILURE
        }
        Err(Failure::Usage(message)) => {
            error_line(&format!("error: {message}"));
            ExitCode::from(2)
        }
        Err(Failure::Error(e)) => {
            error_line(&format!("error: {e}"));
            if usage(&e) { ExitCode::from(2) } else { ExitCode::FAILURE }
        }
    }
}

/// One line on stderr; a stderr that cannot take it has nowhere to report to, and the exit
/// status still tells.
fn error_line(line: &str) {
    let _ = writeln!(io::stderr(), "{line}");
}

/// Clap's rendered error as one line: its error line with what follows it when that line
/// ends in a colon (the missing arguments, each on its own line), the values a flag takes if
/// clap lists them (a backend's, a policy's names), its tip if any, and where help is.
fn one_line(text: &str, program: &str) -> String {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty()).peekable();
    let mut first = lines.next().unwrap_or("error: invalid arguments").trim_end().to_string();
    if first.ends_with(':') {
        let mut listed = Vec::new();
        while let Some(l) = lines.next_if(|l| l.starts_with(char::is_whitespace) && !l.trim_start().starts_with("tip:")) {
            listed.push(l.trim());
        }
        if !listed.is_empty() {
            first = format!("{first} {}", listed.join(", "));
        }
    }
    let rest: Vec<&str> = lines.map(str::trim).collect();
    let possible = rest.iter().find(|l| l.starts_with("[possible values:")).map(|v| format!(" {v}")).unwrap_or_default();
    let tip = rest.iter().find(|l| l.starts_with("tip:")).map(|t| format!(" ({t})")).unwrap_or_default();
    format!("{first}{possible}{tip}; see {program} --help")
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

    #[test]
    fn the_values_a_flag_takes_are_on_the_line() {
        let text = "error: invalid value 'tpu' for '--backend <BACKEND>'\n  [possible values: host, vulkan, qnn]\n\nFor more information, try '--help'.\n";
        assert_eq!(one_line(text, "llada-rt"), "error: invalid value 'tpu' for '--backend <BACKEND>' [possible values: host, vulkan, qnn]; see llada-rt --help");
    }

    #[test]
    fn missing_arguments_are_named_on_the_line() {
        let text = "error: the following required arguments were not provided:\n  --prompt <PROMPT>\n  --tasks <TASKS>\n\nUsage: llada-rt run --prompt <PROMPT> <FILE>\n\nFor more information, try '--help'.\n";
        assert_eq!(one_line(text, "llada-rt"), "error: the following required arguments were not provided: --prompt <PROMPT>, --tasks <TASKS>; see llada-rt --help");
    }
}
