//! Least privilege: the shipped `lease_sweeper` role holds exactly what it
//! needs, the definer functions cannot be hijacked, the holes a planted
//! object or a pre-existing role would open stay shut, and who may call
//! the job queue's SQL API.

mod definer_hijack;
mod holes;
mod jobs_api;
mod role;
pub mod support;
