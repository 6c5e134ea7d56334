//! sov-macros: thin proc-macro shell over sov-spec (work in progress).
