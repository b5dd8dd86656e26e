//! What the command line prints for people and scripts (tables, JSON,
//! errors that say what to do, help that matches README) and the manual
//! pages generated from it.

mod man;
mod output;
