//! SIGTERM and SIGINT ask the server to stop; a second one while it drains exits at once.

use tokio::signal::unix::{signal, Signal, SignalKind};

/// The two stop signals, listened for from the moment they are installed (a signal before
/// the server is ready is not lost).
pub(crate) struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    /// Installs the handlers (inside the runtime).
    pub(crate) fn install() -> std::io::Result<Signals> {
        Ok(Signals { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
    }

    /// Waits for the first stop signal.
    pub(crate) async fn first(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }

    /// After the first: a second signal exits the process at once (status 130, as a shell
    /// reports an interrupted command), however the drain goes.
    pub(crate) fn exit_on_second(mut self) {
        tokio::spawn(async move {
            self.first().await;
            std::process::exit(130);
        });
    }
}
