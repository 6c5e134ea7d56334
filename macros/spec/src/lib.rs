//! sov-spec: parse -> validate -> IR -> codegen for scheduler specs (work in progress).
