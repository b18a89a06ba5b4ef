//! Cedar policies (`[policy] cedar = "FILE"`): a layer after the built-in
//! checks, which can only narrow what they allow.
//!
//! The file is parsed and validated against palisade's schema ([`SCHEMA`],
//! `docs/palisade.cedarschema`) when the configuration is loaded; each error
//! names its line and column. A run the built-in checks allow (or put to a
//! person) is then put to Cedar: the peer is the principal (`User::"<uid>"`,
//! in `Group::"<gid>"` for its primary and supplementary groups), the action
//! `run` (resource `Executable::"<canonical path>"`) or `run_tool` (resource
//! `Tool::"<name>"`), the context what the resolved run will get. Cedar
//! denies unless a `permit` matches and no `forbid` does; a policy whose
//! evaluation fails refuses the run too (it might have been a `forbid`).
//! `approve` is asked the same way for a person answering a waiting run
//! ([`crate::Policy::authorize_approval`]).
//!
//! A `forbid` annotated `@ask("why")` puts the runs it matches to a person
//! instead of refusing them: when every `forbid` that matches asks, and the
//! others permit the run, it waits for approval (rule [`RULE_ASK`], the
//! annotation's text the question). A matching `forbid` without `@ask`
//! still refuses. `approve` is asked without them: the answer is the
//! question's.

use crate::denial::Denial;
use cedar_policy::{
    Authorizer, Context, Entities, Entity, EntityId, EntityTypeName, EntityUid, PolicyId, PolicySet, Request,
    RestrictedExpression, Schema, ValidationMode, Validator,
};
use miette::Diagnostic;
use palisade_protocol::wire::ErrorKind;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// palisade's Cedar schema, the source of truth for what a policy may name:
/// every policy is validated against it, every request built to it.
pub const SCHEMA: &str = include_str!("../../docs/palisade.cedarschema");

/// The stack Cedar's parser, validator and evaluator run on (see
/// [`on_cedar_stack`]): ample for their recursion, mapped only as used.
const CEDAR_STACK_BYTES: usize = 4 << 20;

/// The annotation that names a policy in refusals and explanations
/// (`@id("no-network")`); without it, Cedar's own id (`policy0`, ...).
const NAME_ANNOTATION: &str = "id";

/// The annotation that makes a `forbid` ask a person instead of refusing
/// (`@ask("pushes leave this machine")`); its text is the question.
const ASK_ANNOTATION: &str = "ask";

/// The rule of a run held for approval by a `forbid` with `@ask`.
pub const RULE_ASK: &str = "cedar.ask";
/// The rule of a refusal by a matching `forbid` policy.
pub const RULE_FORBID: &str = "cedar.forbid";
/// The rule of a refusal for want of a matching `permit` (Cedar denies by default).
pub const RULE_NO_PERMIT: &str = "cedar.no_permit";
/// The rule of a refusal because a policy failed to evaluate, or the
/// request could not be put to Cedar.
pub const RULE_ERROR: &str = "cedar.error";

/// A Cedar policy file, parsed and validated against [`SCHEMA`].
#[derive(Debug, Clone)]
pub struct CedarPolicies {
    /// The file, as the configuration resolved it.
    pub path: PathBuf,
    policies: PolicySet,
    /// The same without the `forbid`s that ask (`@ask`): what decides a
    /// run they hold for approval, and every `approve`.
    plain: PolicySet,
    schema: Schema,
}

/// One error in a Cedar policy file: where (1-based), and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CedarError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Who a Cedar request is about: a host user and its groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub uid: u32,
    /// The primary group.
    pub gid: u32,
    /// The supplementary groups.
    pub groups: Vec<u32>,
}

/// The actions of the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A program, with the default profile.
    Run,
    /// A declared tool.
    RunTool,
    /// A person's yes to a run that waits for approval.
    Approve,
}

impl Action {
    /// The action's id in the schema.
    pub fn name(self) -> &'static str {
        match self {
            Action::Run => "run",
            Action::RunTool => "run_tool",
            Action::Approve => "approve",
        }
    }

    /// The action a run is: `run_tool` for a declared tool, else `run`.
    pub fn of(run: &dyn CedarRun) -> Action {
        if run.is_tool() { Action::RunTool } else { Action::Run }
    }
}

/// A run as Cedar is asked about it: the resource it is (its tool, or its
/// program, with the entity that holds its attributes) and the request's
/// context (the schema's `Run`). The decision's resolved run is one
/// (`decision/cedar_run.rs`).
pub trait CedarRun {
    /// Whether the run is a declared tool's.
    fn is_tool(&self) -> bool;
    fn resource(&self) -> Result<(EntityUid, Entity), String>;
    /// `needs_approval`: the built-in checks put the run to a person first.
    fn context(&self, needs_approval: bool) -> Vec<(String, RestrictedExpression)>;
}

/// What Cedar decided for a run it allowed: the request it was asked, and
/// the `permit` policies that matched (by name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CedarVerdict {
    /// `the request (User::"1000", Action::"run", Executable::"/usr/bin/ls")`.
    pub request: String,
    pub permitted_by: Vec<String>,
    /// The `forbid`s with `@ask` that matched: the run waits for a
    /// person's approval first. `None`: none matched.
    pub asked: Option<CedarAsk>,
}

/// A question `forbid` policies with `@ask` put to a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CedarAsk {
    /// The policies that asked, by name.
    pub by: Vec<String>,
    /// Their `@ask` texts, in the order of their names.
    pub reason: String,
}

impl CedarPolicies {
    /// Parses `text` (the file at `path`) and validates it against the
    /// schema; every error found, with its position.
    pub fn parse(text: &str, path: &Path) -> Result<CedarPolicies, Vec<CedarError>> {
        on_cedar_stack(|| CedarPolicies::parse_here(text, path))
    }

    fn parse_here(text: &str, path: &Path) -> Result<CedarPolicies, Vec<CedarError>> {
        let at = |offset: usize, message: String| {
            let (line, column) = crate::spans::line_column(text, offset);
            CedarError { line, column, message }
        };
        let policies = PolicySet::from_str(text)
            .map_err(|errors| errors.iter().map(|e| at(offset_of(e), message_of(e))).collect::<Vec<_>>())?;
        let (schema, _) = Schema::from_cedarschema_str(SCHEMA)
            .map_err(|e| vec![at(0, format!("palisade's Cedar schema does not parse: {e}"))])?;
        let validated = Validator::new(schema.clone()).validate(&policies, ValidationMode::Strict);
        let mut errors: Vec<CedarError> =
            validated.validation_errors().map(|e| at(offset_of(e), message_of(e))).collect();
        errors.extend(templates_and_names(&policies, text).into_iter().map(|(o, m)| at(o, m)));
        errors.extend(asks_misplaced(&policies, text).into_iter().map(|(o, m)| at(o, m)));
        if !errors.is_empty() {
            errors.sort_by(|a, b| (a.line, a.column, &a.message).cmp(&(b.line, b.column, &b.message)));
            return Err(errors);
        }
        let plain = policies.policies().filter(|p| p.annotation(ASK_ANNOTATION).is_none()).cloned();
        let plain = PolicySet::from_policies(plain).map_err(|e| vec![at(0, e.to_string())])?;
        Ok(CedarPolicies { path: path.to_path_buf(), policies, plain, schema })
    }

    /// How many policies the file holds.
    pub fn len(&self) -> usize {
        self.policies.policies().count()
    }

    /// Whether the file holds no policy (Cedar then denies every run).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Cedar's decision on `principal` doing `action` to `run`
    /// (`needs_approval`: the built-in checks put it to a person first).
    pub fn authorize(
        &self,
        principal: &Principal,
        action: Action,
        run: &dyn CedarRun,
        needs_approval: bool,
    ) -> Result<CedarVerdict, Denial> {
        on_cedar_stack(|| self.authorize_here(principal, action, run, needs_approval))
    }

    fn authorize_here(
        &self,
        principal: &Principal,
        action: Action,
        run: &dyn CedarRun,
        needs_approval: bool,
    ) -> Result<CedarVerdict, Denial> {
        let (resource, resource_entity) = run.resource().map_err(|e| error(&e))?;
        let (user, mut entities) = principal_entities(principal)?;
        entities.push(resource_entity);
        let entities = Entities::from_entities(entities, Some(&self.schema)).map_err(|e| error(&e))?;
        let context = Context::from_pairs(run.context(needs_approval)).map_err(|e| error(&e))?;
        let action_uid = uid("Action", action.name())?;
        let described = format!("the request ({user}, {action_uid}, {resource})");
        let request =
            Request::new(user, action_uid, resource, context, Some(&self.schema)).map_err(|e| error(&e))?;
        let asked = Asked { request: &request, entities: &entities, described: &described };
        // An approver's answer is the question's: what asks does not apply to it.
        let set = if action == Action::Approve { &self.plain } else { &self.policies };
        let (allowed, matched) = self.evaluate(set, &asked)?;
        if allowed {
            return Ok(CedarVerdict { request: described, permitted_by: self.names(&matched), asked: None });
        }
        // A forbid that refuses decides: those that ask are not named.
        let refusing: Vec<PolicyId> =
            matched.iter().filter(|id| self.ask_of(id).is_none()).cloned().collect();
        if matched.is_empty() || !refusing.is_empty() {
            return Err(self.refusal(&refusing, &described));
        }
        // Only forbids that ask matched: the run is put to a person if the rest permits it.
        let (allowed, permits) = self.evaluate(&self.plain, &asked)?;
        if !allowed {
            return Err(self.refusal(&permits, &described));
        }
        let mut by: Vec<(String, &str)> =
            matched.iter().map(|id| (self.name_of(id), self.ask_of(id).unwrap_or_default())).collect();
        by.sort();
        let mut reasons: Vec<&str> = by.iter().map(|(_, why)| why.trim()).collect();
        reasons.dedup();
        let ask = CedarAsk { by: by.iter().map(|(n, _)| n.clone()).collect(), reason: reasons.join(" ") };
        Ok(CedarVerdict { request: described, permitted_by: self.names(&permits), asked: Some(ask) })
    }

    /// Cedar's decision on `asked` under `set`: allowed or not, and the
    /// policies that decided it (the permits that matched, or the forbids).
    fn evaluate(&self, set: &PolicySet, asked: &Asked<'_>) -> Result<(bool, Vec<PolicyId>), Denial> {
        let response = Authorizer::new().is_authorized(asked.request, set, asked.entities);
        let diagnostics = response.diagnostics();
        if let Some(e) = diagnostics.errors().next() {
            return Err(Denial::new(
                ErrorKind::PolicyDenied,
                RULE_ERROR,
                format!(
                    "Cedar policy {} failed to evaluate for {}, so the request is refused (a failing \
                     policy might have been a forbid): {e}",
                    self.name_of(first_error_policy(e)),
                    asked.described
                ),
            ));
        }
        let matched = diagnostics.reason().cloned().collect();
        Ok((response.decision() == cedar_policy::Decision::Allow, matched))
    }

    /// The refusal of a request Cedar denied: `forbids` matched, or (none)
    /// no permit did.
    fn refusal(&self, forbids: &[PolicyId], described: &str) -> Denial {
        let named = self.names(forbids);
        if named.is_empty() {
            return Denial::new(
                ErrorKind::PolicyDenied,
                RULE_NO_PERMIT,
                format!(
                    "no Cedar policy in {} permits {described} (Cedar denies what no permit allows)",
                    self.path.display()
                ),
            );
        }
        let (policy, verb) = if named.len() == 1 { ("policy", "forbids") } else { ("policies", "forbid") };
        Denial::new(
            ErrorKind::PolicyDenied,
            RULE_FORBID,
            format!(
                "Cedar {policy} {} {verb} {described} (in {}; a forbid overrides any permit)",
                named.join(", "),
                self.path.display()
            ),
        )
    }

    /// The question policy `id` asks (its `@ask`), if it asks one.
    fn ask_of(&self, id: &PolicyId) -> Option<&str> {
        self.policies.annotation(id, ASK_ANNOTATION)
    }

    /// The policies' names, sorted.
    fn names(&self, ids: &[PolicyId]) -> Vec<String> {
        let mut named: Vec<String> = ids.iter().map(|id| self.name_of(id)).collect();
        named.sort();
        named
    }

    /// A policy's name: its `@id` annotation, else Cedar's id; quoted.
    fn name_of(&self, id: &PolicyId) -> String {
        format!("{:?}", self.policies.annotation(id, NAME_ANNOTATION).unwrap_or(id.as_ref()))
    }
}

/// A request put to Cedar, with its entities and how refusals name it.
struct Asked<'a> {
    request: &'a Request,
    entities: &'a Entities,
    described: &'a str,
}

/// Runs `f` on a stack of [`CEDAR_STACK_BYTES`] whose bounds are known.
/// Cedar checks the stack left before each step of its recursion, and
/// where it cannot tell (the main thread of a static musl binary reports
/// a stack too small) it stops: its validator then passes what it did not
/// check, its evaluator fails every policy. On a stack of its own, the
/// bounds are exact.
fn on_cedar_stack<R>(f: impl FnOnce() -> R) -> R {
    stacker::grow(CEDAR_STACK_BYTES, f)
}

/// The principal's entity, `User::"<uid>"`, and those of its groups, each
/// a parent of it: its primary group and its supplementary ones.
fn principal_entities(principal: &Principal) -> Result<(EntityUid, Vec<Entity>), Denial> {
    let user = uid("User", &principal.uid.to_string())?;
    let groups: BTreeSet<u32> =
        std::iter::once(principal.gid).chain(principal.groups.iter().copied()).collect();
    let group_uids: Vec<EntityUid> =
        groups.iter().map(|g| uid("Group", &g.to_string())).collect::<Result<_, _>>()?;
    let attrs = HashMap::from([("uid".to_string(), long(u64::from(principal.uid)))]);
    let parents = group_uids.iter().cloned().collect();
    let mut entities = vec![Entity::new(user.clone(), attrs, parents).map_err(|e| error(&e))?];
    entities.extend(group_uids.into_iter().map(|g| Entity::new_no_attrs(g, HashSet::new())));
    Ok((user, entities))
}

/// The policy an authorization error is about.
fn first_error_policy(e: &cedar_policy::AuthorizationError) -> &PolicyId {
    match e {
        cedar_policy::AuthorizationError::PolicyEvaluationError(p) => p.policy_id(),
    }
}

/// Templates (policies with `?principal` or `?resource` slots, which are
/// never linked here, so would never apply) and names given twice, as
/// errors at the byte offset they are about.
fn templates_and_names(policies: &PolicySet, text: &str) -> Vec<(usize, String)> {
    let mut errors = Vec::new();
    for t in policies.templates() {
        let offset = ["?principal", "?resource"].iter().filter_map(|s| text.find(s)).min().unwrap_or(0);
        errors.push((
            offset,
            format!("policy {} is a template: palisade links none, so it would never apply", t.id()),
        ));
    }
    let mut seen = HashSet::new();
    for p in policies.policies() {
        if let Some(name) = p.annotation(NAME_ANNOTATION) {
            if !seen.insert(name) {
                let offset = text.find(&format!("\"{name}\"")).map_or(0, |first| {
                    text[first + 1..].find(&format!("\"{name}\"")).map_or(first, |next| first + 1 + next)
                });
                errors.push((offset, format!("two policies are named @id({name:?}): names must be unique")));
            }
        }
    }
    errors
}

/// `@ask` where it cannot apply, as errors at the byte offset of its
/// annotation: on a `permit` (only a forbid's refusal can become a
/// question), or with no question to put.
fn asks_misplaced(policies: &PolicySet, text: &str) -> Vec<(usize, String)> {
    // The n-th policy that asks is the n-th `@ask` of the file (Cedar's ids count in its order).
    let mut asking: Vec<(usize, &cedar_policy::Policy, &str)> = policies
        .policies()
        .filter_map(|p| {
            let id: &str = p.id().as_ref();
            let n = id.strip_prefix("policy").and_then(|n| n.parse().ok()).unwrap_or(usize::MAX);
            p.annotation(ASK_ANNOTATION).map(|why| (n, p, why))
        })
        .collect();
    asking.sort_by_key(|(n, _, _)| *n);
    let mut at = text.match_indices("@ask").map(|(o, _)| o);
    let mut errors = Vec::new();
    for (_, p, why) in asking {
        let offset = at.next().unwrap_or(0);
        let id: &str = p.id().as_ref();
        let name = format!("{:?}", p.annotation(NAME_ANNOTATION).unwrap_or(id));
        if p.effect() == cedar_policy::Effect::Permit {
            errors.push((
                offset,
                format!(
                    "policy {name} is a permit with @ask: only a forbid asks (@ask on a forbid puts \
                     the runs it matches to a person instead of refusing them)"
                ),
            ));
        } else if why.trim().is_empty() {
            errors.push((
                offset,
                format!("policy {name} has @ask without a question: give it one, @ask(\"why a person must approve\")"),
            ));
        }
    }
    errors
}

/// Where a Cedar diagnostic points: its first label's start, else 0.
fn offset_of(d: &dyn Diagnostic) -> usize {
    d.labels().and_then(|mut l| l.next()).map_or(0, |l| l.offset())
}

/// A Cedar diagnostic's message, with its help when it has one.
fn message_of(d: &(impl Diagnostic + ?Sized)) -> String {
    match d.help() {
        Some(help) => format!("{d} ({help})"),
        None => d.to_string(),
    }
}

/// The refusal of a request Cedar could not even be asked.
fn error(e: &dyn std::fmt::Display) -> Denial {
    Denial::new(ErrorKind::PolicyDenied, RULE_ERROR, format!("the Cedar request cannot be built: {e}"))
}

fn uid(type_name: &str, id: &str) -> Result<EntityUid, Denial> {
    let name = EntityTypeName::from_str(type_name).map_err(|e| error(&e))?;
    Ok(EntityUid::from_type_name_and_id(name, EntityId::new(id)))
}

/// A count as a Cedar Long (64-bit signed): larger ones are its largest.
pub(crate) fn long(v: u64) -> RestrictedExpression {
    RestrictedExpression::new_long(i64::try_from(v).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        match CedarPolicies::parse(text, Path::new("p.cedar")) {
            Ok(_) => vec![],
            Err(e) => e.into_iter().map(|e| format!("{}:{}: {}", e.line, e.column, e.message)).collect(),
        }
    }

    #[test]
    fn the_schema_parses_and_declares_the_actions() {
        let (schema, warnings) = Schema::from_cedarschema_str(SCHEMA).unwrap();
        assert_eq!(warnings.count(), 0);
        let actions: BTreeSet<String> = schema.actions().map(|a| a.id().unescaped().to_string()).collect();
        let want: BTreeSet<String> =
            [Action::Run, Action::RunTool, Action::Approve].iter().map(|a| a.name().to_string()).collect();
        assert_eq!(actions, want);
    }

    #[test]
    fn syntax_errors_name_their_line_and_column() {
        let text = "permit(principal, action, resource) when { x };\n\npermit(principal, action, resource) wen { true };";
        let e = errors(text);
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].starts_with("1:44: invalid variable: x"), "{e:?}");
        assert!(e[1].starts_with("3:37: invalid policy condition: wen"), "{e:?}");
        let e = errors("permit(principal, action, resource)");
        assert!(e.len() == 1 && e[0].starts_with("1:"), "{e:?}");
        // Columns count characters, not bytes.
        let e = errors("// héhé\npermit(principal, action, resource) when { \"é\" == x };");
        assert!(e.len() == 1 && e[0].starts_with("2:51: invalid variable: x"), "{e:?}");
    }

    #[test]
    fn schema_errors_name_their_line_and_column() {
        let e = errors("permit(principal, action == Action::\"run\", resource)\nwhen { context.netwrk };");
        assert_eq!(
            e,
            [
                "2:8: for policy `policy0`, attribute `netwrk` in context for Action::\"run\" not found (did you mean `network`?)"
            ]
        );
        let text = "permit(principal, action, resource)\n  when { context.network == 1 };\nforbid(principal in Grup::\"1\", action, resource);";
        let e = errors(text);
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].starts_with("2:10: the types Bool and Long are not compatible"), "{e:?}");
        assert!(
            e[1].starts_with(
                "3:21: for policy `policy1`, unrecognized entity type `Grup` (did you mean `Group`?)"
            ),
            "{e:?}"
        );
        let e = errors("permit(principal, action == Action::\"delete\", resource);");
        assert!(e.len() == 1 && e[0].starts_with("1:29: ") && e[0].contains("delete"), "{e:?}");
    }

    #[test]
    fn templates_and_names_given_twice_are_refused() {
        let e = errors("permit(principal == ?principal, action, resource);");
        assert_eq!(e, ["1:21: policy policy0 is a template: palisade links none, so it would never apply"]);
        let e = errors(
            "@id(\"a\")\npermit(principal, action, resource);\n@id(\"a\")\nforbid(principal, action, resource);",
        );
        assert_eq!(e, ["3:5: two policies are named @id(\"a\"): names must be unique"]);
    }

    /// `@ask` turns a forbid's refusal into a question: on a permit, or
    /// without a question, it is refused at load, naming the policy.
    #[test]
    fn asks_are_forbids_with_a_question() {
        let forbid = "permit(principal, action, resource);\n@ask(\"pushes leave\") forbid(principal, action, resource);";
        assert_eq!(errors(forbid), Vec::<String>::new());
        let e = errors("@id(\"all\")\n@ask(\"why\") permit(principal, action, resource);");
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].starts_with("2:1: policy \"all\" is a permit with @ask: only a forbid asks"), "{e:?}");
        for ask in ["@ask", "@ask(\"\")", "@ask(\"  \")"] {
            let e = errors(&format!(
                "permit(principal, action, resource);\n{ask} forbid(principal, action, resource);"
            ));
            assert_eq!(
                e,
                [
                    "2:1: policy \"policy1\" has @ask without a question: give it one, @ask(\"why a person must approve\")"
                ],
                "{ask}"
            );
        }
        // Each error points at its own policy's @ask.
        let e = errors(
            "@ask(\"a\") forbid(principal, action, resource);\n@ask(\"b\") permit(principal, action, resource);",
        );
        assert!(e.len() == 1 && e[0].starts_with("2:1: policy \"policy1\" is a permit"), "{e:?}");
    }

    /// On a thread whose stack is smaller than Cedar's margin (as a static
    /// musl binary's main thread reports its own), a schema error is still
    /// found: Cedar runs on a stack of its own.
    #[test]
    fn a_small_stack_does_not_hide_schema_errors() {
        let small = std::thread::Builder::new().stack_size(96 << 10);
        let e = small.spawn(|| errors("permit(principal, action, resource) when { context.nope };")).unwrap();
        let e = e.join().unwrap();
        assert!(e.len() == 3 && e.iter().all(|e| e.contains("attribute `nope` in context")), "{e:?}");
    }

    /// Every example of docs/cedar.md is valid against the schema.
    #[test]
    fn the_documented_examples_validate() {
        let doc = include_str!("../../docs/cedar.md");
        let examples: Vec<&str> =
            doc.split("```cedar\n").skip(1).map(|b| b.split("```").next().unwrap_or_default()).collect();
        assert!(examples.len() >= 3, "{} examples", examples.len());
        for text in examples {
            assert_eq!(errors(text), Vec::<String>::new(), "{text}");
            assert!(!CedarPolicies::parse(text, Path::new("doc.cedar")).unwrap().is_empty());
        }
    }
}
