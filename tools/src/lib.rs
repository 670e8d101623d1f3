//! `llada-tools`: what the project needs to make its own models, since weights cannot be
//! downloaded here: random-weight checkpoints with real LLaDA shapes in exact Hugging Face
//! layout (`checkpoint`), and LLaDA written in burn (`reference`): the independent model the
//! tests check the runtime against, and the one the trainer trains.

#![recursion_limit = "256"]

pub mod checkpoint;
pub mod reference;
pub mod tasks;
pub mod train;
