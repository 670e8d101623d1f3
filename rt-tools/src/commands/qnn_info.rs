//! `llada-rt qnn-info`: whether Qualcomm's QNN HTP library is usable here, and what it is.

use std::path::PathBuf;

use clap::Args;
use llada_cli::{outln, Failure};

use crate::Done;

#[derive(Args)]
pub(crate) struct QnnInfo {
    /// Folder holding libQnnHtp.so and libQnnSystem.so [default: LLADA_QNN_LIB].
    #[arg(long)]
    qnn_lib: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

impl QnnInfo {
    pub(crate) fn run(self) -> Done {
        let QnnInfo { qnn_lib, json } = self;
        use llada_rt::executor::qnn::QnnLibrary;
        // No library (or one that cannot be used) is the machine's setup, as a usage error.
        let flag = if qnn_lib.is_none() { " (or name the folder with --qnn-lib DIR)" } else { "" };
        let lib = QnnLibrary::open(qnn_lib.as_deref()).map_err(|e| Failure::Usage(format!("{e}{flag}")))?;
        let table = lib.backend_api_version().map_err(llada_rt::Error::from)?;
        drop(lib.backend().map_err(llada_rt::Error::from)?);
        let v = |v: llada_rt::executor::qnn::abi::Version| format!("{}.{}.{}", v.major, v.minor, v.patch);
        if json {
            let report = serde_json::json!({
                "dir": lib.dir, "provider": lib.provider_name, "backend_id": lib.backend_id,
                "core_api": v(lib.api_version.core), "backend_api": v(lib.api_version.backend), "build_id": lib.build_id,
            });
            outln!("{}", serde_json::to_string_pretty(&report).expect("a JSON value serializes"))?;
        } else {
            outln!("library:      {}", lib.dir.join(llada_rt::executor::qnn::library::HTP_LIBRARY).display())?;
            outln!("provider:     {} (backend id {})", lib.provider_name, lib.backend_id)?;
            outln!("core API:     {} (backendGetApiVersion: {})", v(lib.api_version.core), v(table.core))?;
            outln!("backend API:  {}", v(lib.api_version.backend))?;
            outln!("build:        {}", lib.build_id)?;
            outln!("backend:      created and freed")?;
        }
        Ok(())
    }
}
