//! Parsing and validation of a runtime interface file (`specs/runtime.toml`): the 32-slot
//! layout, the actions and the predicates. Produces [`ir::Interface`] or every error found.

use std::collections::HashMap;
use std::ops::Range;

use crate::diag::Diags;
use crate::ir::{Interface, Named, SLOT_COUNT, SlotField, SlotType, Writer};
use crate::source::Source;
use crate::walk::{Reader, Table, camel, entries, is_snake_ident, parse_document};

/// Names of items the interface macro generates; enum slot types must not take them.
const RESERVED_TYPES: &[&str] = &[
    "Slots",
    "SlotMemory",
    "SlotError",
    "SlotField",
    "SlotType",
    "SlotWriter",
    "Action",
    "Actions",
    "Guards",
    "Transition",
    "Cause",
    "Machine",
    "UnknownState",
];

/// Methods of the generated `Slots` that field accessors must not shadow.
const RESERVED_METHODS: &[&str] = &[
    "new",
    "from_memory",
    "memory",
    "raw",
    "load_raw",
    "get_by_name",
    "set_by_name",
    "word",
    "set_word",
    "clear",
    "fields",
];

/// Parses and validates an interface file.
pub fn parse_interface(src: &Source) -> Result<Interface, Diags> {
    let mut diags = Diags::default();
    let Some(doc) = parse_document(src, &mut diags) else {
        return Err(diags);
    };
    let mut r = Reader {
        src,
        diags: &mut diags,
    };
    let interface = read_interface(&mut r, doc.get_ref(), &doc.span());
    if diags.is_empty() {
        interface.ok_or(diags)
    } else {
        Err(diags)
    }
}

pub(crate) fn read_interface(
    r: &mut Reader<'_>,
    root: &Table<'_>,
    root_span: &Range<usize>,
) -> Option<Interface> {
    r.deny_unknown(
        root,
        &["interface", "slots", "actions", "predicates"],
        "an interface file",
    );

    let (name, doc) = match root.get("interface") {
        Some(v) => {
            let span = v.span();
            match r.table(v, "[interface]") {
                Some(t) => {
                    r.deny_unknown(t, &["name", "doc"], "[interface]");
                    let name = r.req_string(t, &span, "name", "[interface]");
                    let doc = r.opt_string(t, "doc", "[interface]");
                    (
                        name.map(|s| s.value),
                        doc.map(|s| s.value).unwrap_or_default(),
                    )
                }
                None => (None, String::new()),
            }
        }
        None => {
            r.error(
                root_span.start..root_span.start,
                "an interface file needs an [interface] table with a `name`",
            );
            (None, String::new())
        }
    };

    let mut names: HashMap<String, (Range<usize>, &'static str)> = HashMap::new();
    let slots = read_slots(r, root, root_span, &mut names);
    let actions = read_named(r, root, "actions", "action", &mut names);
    let predicates = read_named(r, root, "predicates", "predicate", &mut names);

    Some(Interface {
        name: name?,
        doc,
        slots,
        actions,
        predicates,
    })
}

/// Records `name` in the shared namespace, reporting a duplicate.
fn claim(
    r: &mut Reader<'_>,
    names: &mut HashMap<String, (Range<usize>, &'static str)>,
    name: &str,
    span: Range<usize>,
    kind: &'static str,
) {
    if let Some((first, first_kind)) = names.get(name) {
        let (line, col) = r.src.line_col(first.start);
        r.error(
            span,
            format!("duplicate name `{name}`: already declared as a {first_kind} at {line}:{col}"),
        );
    } else {
        names.insert(name.to_string(), (span, kind));
    }
}

fn read_named(
    r: &mut Reader<'_>,
    root: &Table<'_>,
    key: &str,
    kind: &'static str,
    names: &mut HashMap<String, (Range<usize>, &'static str)>,
) -> Vec<Named> {
    let Some(v) = root.get(key) else {
        return Vec::new();
    };
    let Some(table) = r.table(v, &format!("[{key}]")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (name, span, value) in entries(table) {
        if !is_snake_ident(name) {
            r.error(
                span.clone(),
                format!("{kind} name `{name}` must be lower snake case and not a Rust keyword"),
            );
        }
        claim(r, names, name, span.clone(), kind);
        let doc = r.string(value, &format!("the doc line of {kind} `{name}`"));
        out.push(Named {
            name: name.to_string(),
            doc: doc.map(|d| d.value).unwrap_or_default(),
        });
    }
    out
}

fn read_slots(
    r: &mut Reader<'_>,
    root: &Table<'_>,
    root_span: &Range<usize>,
    names: &mut HashMap<String, (Range<usize>, &'static str)>,
) -> Vec<SlotField> {
    let Some(v) = root.get("slots") else {
        r.error(
            root_span.start..root_span.start,
            "an interface file needs a [slots] table",
        );
        return Vec::new();
    };
    let Some(table) = r.table(v, "[slots]") else {
        return Vec::new();
    };
    let mut fields: Vec<(SlotField, Range<usize>)> = Vec::new();
    let mut methods: HashMap<String, String> = HashMap::new();
    let mut types: HashMap<String, String> = HashMap::new();
    for (name, key_span, value) in entries(table) {
        if !is_snake_ident(name) {
            r.error(
                key_span.clone(),
                format!("slot name `{name}` must be lower snake case and not a Rust keyword"),
            );
        }
        claim(r, names, name, key_span.clone(), "slot");
        let what = format!("slot `{name}`");
        let Some(t) = r.table(value, &what) else {
            continue;
        };
        if let Some(field) = read_slot(r, name, t, &value.span(), &key_span) {
            check_generated_names(r, &field, &key_span, &mut methods, &mut types);
            fields.push((field, key_span));
        }
    }
    check_layout(r, &fields);
    let mut slots: Vec<SlotField> = fields.into_iter().map(|(f, _)| f).collect();
    slots.sort_by_key(|f| f.offset);
    slots
}

fn read_slot(
    r: &mut Reader<'_>,
    name: &str,
    t: &Table<'_>,
    span: &Range<usize>,
    key_span: &Range<usize>,
) -> Option<SlotField> {
    let what = format!("slot `{name}`");
    r.deny_unknown(
        t,
        &[
            "offset", "width", "type", "variants", "len", "writer", "doc",
        ],
        &what,
    );
    let offset = match t.get("offset") {
        Some(v) => r.integer(v, &format!("`offset` of {what}")),
        None => {
            r.error(span.clone(), format!("{what} has no `offset`"));
            None
        }
    };
    let width_value = t.get("width");
    let width = match width_value {
        Some(v) => r.integer(v, &format!("`width` of {what}")),
        None => Some(1),
    };
    let width_span = width_value.map_or(key_span.clone(), |v| v.span());
    let ty_str = r.req_string(t, span, "type", &what);
    let writer = match r.opt_string(t, "writer", &what) {
        None => Some(Writer::Runtime),
        Some(s) => match s.value.as_str() {
            "runtime" => Some(Writer::Runtime),
            "machine" => Some(Writer::Machine),
            other => {
                r.error(
                    s.span,
                    format!(
                        "`writer` of {what} must be \"runtime\" or \"machine\", not \"{other}\""
                    ),
                );
                None
            }
        },
    };
    let doc = r.req_string(t, span, "doc", &what).map(|d| d.value);

    let ty = match ty_str.as_ref().map(|s| s.value.as_str()) {
        Some("u32") => Some(SlotType::U32),
        Some("enum") => read_variants(r, name, t, span),
        Some("bytes") => match t.get("len") {
            Some(v) => r
                .integer(v, &format!("`len` of {what}"))
                .map(|len| SlotType::Bytes {
                    len: u32::try_from(len).unwrap_or(u32::MAX),
                }),
            None => {
                r.error(
                    span.clone(),
                    format!("{what} of type bytes has no `len` (in bytes)"),
                );
                None
            }
        },
        Some(other) => {
            let span = ty_str.as_ref().map_or(span.clone(), |s| s.span.clone());
            r.error(
                span,
                format!("unknown slot type `{other}` for {what} (known: u32, enum, bytes)"),
            );
            None
        }
        None => None,
    };
    if !matches!(ty, Some(SlotType::Enum(_)))
        && let Some(v) = t.get("variants")
    {
        r.error(
            v.span(),
            format!("`variants` is only for enum slots, and {what} is not one"),
        );
    }
    if !matches!(ty, Some(SlotType::Bytes { .. }))
        && let Some(v) = t.get("len")
    {
        r.error(
            v.span(),
            format!("`len` is only for bytes slots, and {what} is not one"),
        );
    }

    let (offset, width, ty) = (offset?, width?, ty?);
    let offset_span = t.get("offset").map_or(span.clone(), |v| v.span());
    if offset < 0 || offset >= i64::from(SLOT_COUNT) {
        r.error(
            offset_span,
            format!("{what} starts at slot {offset}, past the {SLOT_COUNT} slots (0..=31)"),
        );
        return None;
    }
    if width < 1 {
        r.error(
            width_span,
            format!("{what} must be at least 1 slot wide, not {width}"),
        );
        return None;
    }
    let fits = match &ty {
        SlotType::U32 | SlotType::Enum(_) => width == 1,
        SlotType::Bytes { len } => i64::from(*len) == 4 * width,
    };
    if !fits {
        let msg = match &ty {
            SlotType::Bytes { len } => format!(
                "width of {what} does not fit its type: {len} bytes need {} slots of 4 bytes, \
                 but it is {width} slots ({} bytes) wide",
                len.div_ceil(4),
                4 * width
            ),
            other => format!(
                "width of {what} does not fit its type: a {} field is 1 slot wide, not {width}",
                other.keyword()
            ),
        };
        r.error(width_span.clone(), msg);
        return None;
    }
    if offset + width > i64::from(SLOT_COUNT) {
        r.error(
            width_span,
            format!(
                "{what} covers slots {offset}..={} and runs past the last slot (31)",
                offset + width - 1
            ),
        );
        return None;
    }
    Some(SlotField {
        name: name.to_string(),
        offset: u32::try_from(offset).ok()?,
        width: u32::try_from(width).ok()?,
        ty,
        writer: writer?,
        doc: doc?,
    })
}

fn read_variants(
    r: &mut Reader<'_>,
    name: &str,
    t: &Table<'_>,
    span: &Range<usize>,
) -> Option<SlotType> {
    let what = format!("enum slot `{name}`");
    let Some(v) = t.get("variants") else {
        r.error(span.clone(), format!("{what} has no `variants`"));
        return None;
    };
    let items = r.strings(v, &format!("`variants` of {what}"));
    if items.is_empty() {
        r.error(v.span(), format!("{what} needs at least one variant"));
        return None;
    }
    let mut seen: Vec<&str> = Vec::new();
    let mut ok = true;
    for item in &items {
        if !is_snake_ident(&item.value) {
            r.error(
                item.span.clone(),
                format!(
                    "variant `{}` must be lower snake case and not a Rust keyword",
                    item.value
                ),
            );
            ok = false;
        }
        if seen.contains(&item.value.as_str()) {
            r.error(
                item.span.clone(),
                format!(
                    "duplicate name: variant `{}` appears twice in {what}",
                    item.value
                ),
            );
            ok = false;
        }
        seen.push(&item.value);
    }
    ok.then(|| SlotType::Enum(items.iter().map(|i| i.value.clone()).collect()))
}

/// Generated accessor and type names must not collide with each other or the fixed API.
fn check_generated_names(
    r: &mut Reader<'_>,
    field: &SlotField,
    span: &Range<usize>,
    methods: &mut HashMap<String, String>,
    types: &mut HashMap<String, String>,
) {
    let mut mine = vec![field.name.clone(), format!("set_{}", field.name)];
    if let SlotType::Enum(_) = field.ty {
        mine.push(format!("{}_raw", field.name));
        let ty = camel(&field.name);
        if RESERVED_TYPES.contains(&ty.as_str()) {
            r.error(
                span.clone(),
                format!("enum slot `{}` would generate type `{ty}`, a name the generated API already uses", field.name),
            );
        } else if let Some(other) = types.insert(ty.clone(), field.name.clone()) {
            r.error(
                span.clone(),
                format!(
                    "duplicate name: enum slots `{other}` and `{}` both generate type `{ty}`",
                    field.name
                ),
            );
        }
    }
    for m in mine {
        if RESERVED_METHODS.contains(&m.as_str()) {
            r.error(
                span.clone(),
                format!(
                    "slot `{}` would generate `Slots::{m}`, a method the generated API already has",
                    field.name
                ),
            );
        } else if let Some(other) = methods.insert(m.clone(), field.name.clone()) {
            r.error(
                span.clone(),
                format!(
                    "duplicate name: slots `{other}` and `{}` both generate `Slots::{m}`",
                    field.name
                ),
            );
        }
    }
}

/// Overlap check over all fields (bounds were checked per field).
fn check_layout(r: &mut Reader<'_>, fields: &[(SlotField, Range<usize>)]) {
    let mut owner: [Option<usize>; SLOT_COUNT as usize] = [None; SLOT_COUNT as usize];
    for (i, (field, span)) in fields.iter().enumerate() {
        let mut clash: Option<usize> = None;
        for slot in field.offset..field.offset + field.width {
            let Some(cell) = owner.get_mut(slot as usize) else {
                continue;
            };
            match cell {
                Some(j) => {
                    clash.get_or_insert(*j);
                }
                None => *cell = Some(i),
            }
        }
        if let Some(j) = clash {
            let other = &fields[j].0;
            r.error(
                span.clone(),
                format!(
                    "slot `{}` (slots {}..={}) overlaps slot `{}` (slots {}..={})",
                    field.name,
                    field.offset,
                    field.offset + field.width - 1,
                    other.name,
                    other.offset,
                    other.offset + other.width - 1
                ),
            );
        }
    }
}
