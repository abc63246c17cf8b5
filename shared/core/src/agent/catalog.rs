//! The catalog: every agent and tool a deployment knows, the MCP servers' tools once
//! listed, prices and guardrails. Built once at start-up (`Catalog::build`); a bad agents
//! file is a start-up error that names the problem.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::{
    AgentDef, AgentsFile, Book, CatalogError, Limits, PluginError, Preparation, Prepare, Prepared,
    Tools, agent_def, grants, is_subagent, plugin, server_of,
};
use baton_engine::builtin;

use crate::agents_file::NotifierSpec;
use crate::cost::Prices;
use crate::llm::ToolSpec;
use crate::plan;
use crate::run::Run;
use crate::timeline::Entry;
use crate::tools::{self, Offered, Tool, ToolDef, ToolServer};

/// Every agent and tool a deployment knows, its plugins and its guardrails: what each step's
/// [`Book`] is taken from.
pub struct Catalog {
    agents: Arc<HashMap<String, AgentDef>>,
    /// Each agent's plugins, asked in order before each of its thinks.
    plugins: HashMap<String, Vec<Arc<dyn Prepare>>>,
    tools: HashMap<String, Arc<ToolDef>>,
    /// `tools` as a step is handed them.
    offered: Arc<Tools>,
    pub limits: Limits,
    pub prices: Arc<Prices>,
    servers: BTreeMap<String, Server>,
    /// `servers`' names.
    server_names: Arc<BTreeSet<String>>,
    /// The channels questions are told through, `${VAR}` expanded.
    notifiers: Arc<BTreeMap<String, NotifierSpec>>,
}

/// An MCP server and the tools it listed, once it has.
struct Server {
    server: Arc<dyn ToolServer>,
    listed: RwLock<Option<Arc<ServerTools>>>,
    /// When a listing was last tried, so that a server that is down is asked again only
    /// every [`RELIST_INTERVAL`].
    tried: Mutex<Option<Instant>>,
}

/// One MCP server's tools, by name: as the catalog holds them, and as a step is handed them.
struct ServerTools {
    defs: HashMap<String, Arc<ToolDef>>,
    offered: Arc<Tools>,
}

/// Tools by name as a step is handed them.
fn offered(defs: &HashMap<String, Arc<ToolDef>>) -> Arc<Tools> {
    Arc::new(
        defs.iter()
            .map(|(name, def)| (name.clone(), def.clone() as Arc<dyn Offered>))
            .collect(),
    )
}

/// The MCP servers' tools as listed at one moment ([`Catalog::listed`]): what one step sees,
/// whatever a server lists while the step is under way, so that every pass of the step
/// decides alike. The next step takes a new one.
#[derive(Clone, Default)]
pub struct Listed(BTreeMap<String, Arc<ServerTools>>);

impl Listed {
    fn server(&self, name: &str) -> Option<&HashMap<String, Arc<ToolDef>>> {
        self.0.get(name).map(|t| &t.defs)
    }
}

/// How often a server whose tools could not be listed is asked again.
pub const RELIST_INTERVAL: Duration = Duration::from_secs(30);

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("agents", &self.agent_names())
            .field("servers", &self.servers.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The name of the built-in page-fetching tool (`baton-tools` provides it when the agents
/// file allows hosts); the built-in `explore` agent has it then.
pub const HTTP_FETCH: &str = "http_fetch";

/// What a catalog is built from besides the agents file: Rust tools (the built-in `echo`
/// is always there) and MCP servers by name.
#[derive(Default)]
pub struct Toolbox {
    pub tools: Vec<Arc<dyn Tool>>,
    pub servers: BTreeMap<String, Arc<dyn ToolServer>>,
}

impl Catalog {
    /// The MCP server that serves the tool `name`, if one of this catalog's does.
    pub fn mcp_server_of<'a>(&self, name: &'a str) -> Option<&'a str> {
        server_of(name).filter(|s| self.servers.contains_key(*s))
    }

    /// What a step is handed of this catalog: its agents, its tools and the MCP servers'
    /// as `listed`, its guardrails and prices. Shares what it holds: cheap to take.
    pub fn book(&self, listed: &Listed) -> Book {
        Book {
            agents: self.agents.clone(),
            tools: self.offered.clone(),
            listed: listed
                .0
                .iter()
                .map(|(name, tools)| (name.clone(), tools.offered.clone()))
                .collect(),
            servers: self.server_names.clone(),
            limits: self.limits.clone(),
            prices: self.prices.clone(),
        }
    }

    /// The names of `agent`'s plugins, in order.
    pub fn plugin_names(&self, agent: &str) -> Vec<&str> {
        self.plugins
            .get(agent)
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .map(|p| p.name())
            .collect()
    }

    /// Whether `agent` has plugins.
    pub fn has_plugins(&self, agent: &str) -> bool {
        self.plugins.get(agent).is_some_and(|p| !p.is_empty())
    }

    /// What `agent`'s plugins add to the next iteration of `run` (`timeline` as the step
    /// read it); the engine adds the tools the run was granted.
    pub async fn prepare(
        &self,
        agent: &str,
        run: &Run,
        timeline: &[Entry],
    ) -> Result<Preparation, PluginError> {
        let plugins = self.plugins.get(agent).map_or(&[][..], Vec::as_slice);
        plugin::prepare(agent, plugins, run, timeline).await
    }

    /// The built-in agents, the built-in tools plus `extra_tools`, and the agents of `file`
    /// (which may redefine a built-in agent).
    pub fn new(
        limits: Limits,
        extra_tools: Vec<Arc<dyn Tool>>,
        file: Option<AgentsFile>,
    ) -> Result<Self, CatalogError> {
        let toolbox = Toolbox {
            tools: extra_tools,
            servers: BTreeMap::new(),
        };
        Self::build(limits, toolbox, file)
    }

    /// [`Catalog::new`] with MCP servers: `toolbox.servers` are the file's `mcpServers`,
    /// built by `baton-tools`. Every tool's schema is compiled here: one that does not
    /// compile stops the start.
    pub fn build(
        limits: Limits,
        toolbox: Toolbox,
        file: Option<AgentsFile>,
    ) -> Result<Self, CatalogError> {
        let catalog = Self::assemble(limits, toolbox, file)?;
        for def in catalog.tools.values() {
            def.check()?;
        }
        for agent in catalog.agents.values() {
            let schemas = agent
                .output
                .iter()
                .map(|o| ("`outputSchema`".to_owned(), o))
                .chain(agent.actions.iter().flat_map(|(name, a)| {
                    [("inputSchema", &a.input), ("outputSchema", &a.output)]
                        .into_iter()
                        .filter_map(move |(which, s)| {
                            s.as_ref()
                                .map(|s| (format!("action `{name}`: `{which}`"), s))
                        })
                }));
            for (what, schema) in schemas {
                if let Err(e) = jsonschema::validator_for(&schema.spec().parameters) {
                    return Err(CatalogError::Invalid {
                        agent: agent.name.clone(),
                        message: format!("{what} is not a valid JSON schema: {e}"),
                    });
                }
            }
        }
        Ok(catalog)
    }

    /// The catalog, its tools' schemas not compiled ([`Catalog::declared`] never needs them).
    pub(super) fn assemble(
        mut limits: Limits,
        toolbox: Toolbox,
        file: Option<AgentsFile>,
    ) -> Result<Self, CatalogError> {
        let file = file.unwrap_or_default();
        for (model, price) in &file.prices {
            price.check(model).map_err(CatalogError::BadPrice)?;
        }
        match file.tool_timeout_seconds {
            Some(0) => return Err(CatalogError::ZeroTimeout),
            Some(s) => limits.tool_timeout = Duration::from_secs(s),
            None => {}
        }
        if let Some(plans) = &file.plans {
            set_plan_limits(&mut limits.plan, plans)?;
        }
        let fetch = toolbox.tools.iter().any(|t| t.name() == HTTP_FETCH);
        let explore_tools: &[&str] = if fetch { &[HTTP_FETCH] } else { &[] };
        let mut agents: BTreeMap<String, AgentDef> = builtin::agents(&limits, explore_tools)
            .into_iter()
            .map(|a| (a.name.clone(), a))
            .collect();
        // The plan helpers' models, their built-in prompts kept (an agent of their name in
        // the file replaces them whole, below).
        if let Some(plans) = &file.plans {
            for (helper, model) in [
                (plan::PLANNER, &plans.planner_model),
                (plan::PLAN_REVIEWER, &plans.reviewer_model),
            ] {
                if let (Some(a), Some(m)) = (agents.get_mut(helper), model) {
                    a.model = Some(m.clone());
                }
            }
        }
        for (name, spec) in file.agents {
            let def = agent_def(&limits, name, spec)?;
            agents.insert(def.name.clone(), def);
        }
        for (server, spec) in &file.mcp_servers {
            if !toolbox.servers.contains_key(server) {
                return Err(CatalogError::Server {
                    server: server.clone(),
                    message: "no client was built for it".into(),
                });
            }
            for agent in &spec.agents {
                let Some(a) = agents.get_mut(agent) else {
                    return Err(CatalogError::Server {
                        server: server.clone(),
                        message: format!("grants its tools to `{agent}`, which is not an agent"),
                    });
                };
                a.tools.push(format!("mcp:{server}"));
            }
        }

        // A plan requirement names an agent a plan step may start.
        for a in agents.values() {
            for required in a.plan_requirements.values().flatten() {
                let r = &required.agent;
                if !agents.contains_key(r) || !baton_engine::agent::is_subagent(r) {
                    return Err(CatalogError::Invalid {
                        agent: a.name.clone(),
                        message: format!(
                            "`planRequirements` names `{r}`, which is not an agent a plan step \
                             may start"
                        ),
                    });
                }
            }
        }
        let notifiers = super::notifiers::checked(&file.notifiers)?;
        for a in agents.values() {
            super::notifiers::check_agent(a, &notifiers)?;
        }

        for internal in [plan::PLANNER, plan::PLAN_REVIEWER] {
            if agents.get(internal).is_some_and(|a| !a.tools.is_empty()) {
                return Err(CatalogError::InternalWithTools(internal.into()));
            }
        }
        let mut tools: HashMap<String, Arc<ToolDef>> = HashMap::new();
        for (spec, kind) in builtin::tools(&mut agents, &limits) {
            tools.insert(spec.name.clone(), Arc::new(ToolDef::from_spec(spec, kind)));
        }
        let mut executable: Vec<Arc<dyn Tool>> = vec![Arc::new(tools::Echo)];
        executable.extend(toolbox.tools);
        for t in executable {
            let def = ToolDef::from_tool(t);
            let name = def.spec.name.clone();
            if tools.insert(name.clone(), Arc::new(def)).is_some() {
                return Err(CatalogError::DuplicateTool(name));
            }
        }

        for a in agents.values() {
            for t in &a.tools {
                let known = match t.strip_prefix("mcp:") {
                    Some(server) => toolbox.servers.contains_key(server),
                    None => {
                        tools.contains_key(t)
                            || server_of(t).is_some_and(|s| toolbox.servers.contains_key(s))
                    }
                };
                if !known {
                    let mut known: Vec<String> = tools.keys().cloned().collect();
                    known.extend(toolbox.servers.keys().map(|s| format!("mcp:{s}")));
                    known.sort_unstable();
                    return Err(CatalogError::UnknownTool {
                        agent: a.name.clone(),
                        tool: t.clone(),
                        known: known.join(", "),
                    });
                }
            }
            for tool in a.approval.keys() {
                if !grants(a, tool) {
                    return Err(CatalogError::ApprovalForMissingTool {
                        agent: a.name.clone(),
                        tool: tool.clone(),
                    });
                }
            }
        }
        let server_names = Arc::new(toolbox.servers.keys().cloned().collect());
        let servers = toolbox
            .servers
            .into_iter()
            .map(|(name, server)| {
                let slot = Server {
                    server,
                    listed: RwLock::new(None),
                    tried: Mutex::new(None),
                };
                (name, slot)
            })
            .collect();
        Ok(Self {
            agents: Arc::new(agents.into_iter().collect()),
            plugins: HashMap::new(),
            offered: offered(&tools),
            tools,
            limits,
            prices: Arc::new(Prices::with(&file.prices)),
            servers,
            server_names,
            notifiers: Arc::new(notifiers),
        })
    }

    /// The channel `name` of the agents file's `notifiers`.
    pub fn notifier(&self, name: &str) -> Option<&NotifierSpec> {
        self.notifiers.get(name)
    }

    /// The names of the agents file's e-mail channels (a host that sends no e-mail refuses
    /// to start with any).
    pub fn email_channels(&self) -> Vec<&str> {
        self.notifiers
            .iter()
            .filter(|(_, n)| n.kind == crate::agents_file::NotifierKind::Email)
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// The built-in agents and tools, plus the agents of the file at `agents_file` if one
    /// is given, with the default guardrails. (A file with MCP servers, HTTP tools or
    /// `httpFetch` needs their clients: `baton_tools::load_catalog`.)
    pub fn load(agents_file: Option<&std::path::Path>) -> Result<Self, CatalogError> {
        let file = agents_file.map(AgentsFile::load).transpose()?;
        Self::new(Limits::default(), vec![], file)
    }

    /// Gives `agent` a plugin, asked after those it has (see [`super::Plugin`]).
    pub fn with_plugin(self, agent: &str, plugin: impl super::Plugin) -> Self {
        self.with_prepare(agent, Arc::new(plugin::Typed(plugin)))
    }

    /// [`Catalog::with_plugin`], of a plugin already typed away.
    pub(super) fn with_prepare(mut self, agent: &str, plugin: Arc<dyn super::Prepare>) -> Self {
        if self.agents.contains_key(agent) {
            self.plugins
                .entry(agent.to_owned())
                .or_default()
                .push(plugin);
        }
        self
    }

    pub fn agent(&self, name: &str) -> Option<&AgentDef> {
        self.agents.get(name)
    }

    /// Whether a plan step (or `spawn_subagent`) may start agent `name`.
    pub fn is_subagent(&self, name: &str) -> bool {
        self.agents.contains_key(name) && is_subagent(name)
    }

    pub fn agent_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.agents.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Every model a run may call, `provider:model-id`, each with the agents that call it
    /// (sorted): `default` (`BATON_MODEL`) for the agents that name none. What a host builds
    /// model clients for, and says at start-up.
    pub fn models(&self, default: &str) -> Vec<(String, Vec<&str>)> {
        let mut models: std::collections::BTreeMap<String, Vec<&str>> = Default::default();
        for name in self.agent_names() {
            for model in self.agents[name].models() {
                let (provider, id) = crate::cost::split_model(model.unwrap_or(default));
                let agents = models.entry(format!("{provider}:{id}")).or_default();
                if agents.last() != Some(&name) {
                    agents.push(name);
                }
            }
        }
        models.into_iter().collect()
    }

    /// The model providers a host's runs call: each agent's model's, and `default`'s
    /// (`BATON_MODEL`) for the agents that name none. A host builds a client for these only.
    pub fn providers(&self, default: &str) -> std::collections::BTreeSet<String> {
        self.models(default)
            .into_iter()
            .map(|(model, _)| crate::cost::split_model(&model).0.to_owned())
            .chain([crate::cost::split_model(default).0.to_owned()])
            .collect()
    }

    /// The tool `name` if `agent` may call it in an iteration `prepared` added to: a tool
    /// it lists, one its plugins added, or a listed tool of an MCP server it is granted.
    pub fn tool_for(
        &self,
        listed: &Listed,
        agent: &AgentDef,
        prepared: &Prepared,
        name: &str,
    ) -> Option<Arc<ToolDef>> {
        if prepared.tools.iter().any(|t| t == name) || grants(agent, name) {
            self.tool(listed, name)
        } else {
            None
        }
    }

    /// A tool by name: a catalog tool, or an MCP server's tool as `listed`.
    pub fn tool(&self, listed: &Listed, name: &str) -> Option<Arc<ToolDef>> {
        if let Some(def) = self.tools.get(name) {
            return Some(def.clone());
        }
        listed.server(server_of(name)?)?.get(name).cloned()
    }

    /// The MCP servers' tools as listed now (see [`Listed`]).
    pub fn listed(&self) -> Listed {
        Listed(
            self.servers
                .iter()
                .filter_map(|(name, slot)| {
                    let tools = slot.listed.read().unwrap_or_else(|e| e.into_inner());
                    Some((name.clone(), tools.clone()?))
                })
                .collect(),
        )
    }

    /// The tool specs an agent's model is given in an iteration: its own tools, its MCP
    /// servers' as `listed` (see [`Catalog::list_servers`]), and what its plugins added.
    pub fn specs(&self, listed: &Listed, agent: &AgentDef, prepared: &Prepared) -> Vec<ToolSpec> {
        self.book(listed).specs(agent, prepared)
    }

    /// Lists the tools of the MCP servers `agent` uses, once per process: a server listed
    /// before is not asked again; one that could not be reached is asked again at most every
    /// [`RELIST_INTERVAL`]. A server that stays down leaves its tools out (and a call to one
    /// of them gets an error result); it never fails the step.
    pub async fn list_servers(&self, agent: &AgentDef, prepared: &Prepared) {
        self.list_servers_for(agent, prepared, &Default::default())
            .await;
    }

    /// [`Catalog::list_servers`] for a run with this `scope` (see [`ToolServer::list_for`]).
    pub async fn list_servers_for(
        &self,
        agent: &AgentDef,
        prepared: &Prepared,
        scope: &crate::scope::Scope,
    ) {
        let mut wanted: Vec<&str> = agent
            .tools
            .iter()
            .chain(&prepared.tools)
            .filter_map(|t| t.strip_prefix("mcp:").or_else(|| server_of(t)))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        self.list(wanted, scope).await;
    }

    async fn list(&self, wanted: Vec<&str>, scope: &crate::scope::Scope) {
        for name in wanted {
            let Some(slot) = self.servers.get(name) else {
                continue;
            };
            if !slot.server.lists_for(scope) {
                continue;
            }
            if slot
                .listed
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .is_some()
            {
                continue;
            }
            {
                let mut tried = slot.tried.lock().unwrap_or_else(|e| e.into_inner());
                if tried.is_some_and(|t| t.elapsed() < RELIST_INTERVAL) {
                    continue;
                }
                *tried = Some(Instant::now());
            }
            match slot.server.list_for(scope).await {
                Ok(list) => {
                    let mut defs = HashMap::new();
                    for tool in list {
                        let def = ToolDef::from_tool(tool);
                        match def.check() {
                            Ok(()) => {
                                defs.insert(def.spec.name.clone(), Arc::new(def));
                            }
                            Err(e) => warn!(server = name, error = %e, "MCP tool left out"),
                        }
                    }
                    info!(server = name, tools = defs.len(), "MCP server listed");
                    let tools = ServerTools {
                        offered: offered(&defs),
                        defs,
                    };
                    *slot.listed.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(tools));
                }
                Err(e) => warn!(server = name, error = %e, "MCP server cannot list its tools"),
            }
        }
    }
}

/// The agents file's `plans` caps, each within its bounds.
fn set_plan_limits(
    limits: &mut plan::PlanLimits,
    spec: &crate::agents_file::PlansSpec,
) -> Result<(), CatalogError> {
    let check = |field: &'static str, v: Option<u64>, max: u64| match v {
        Some(n) if !(1..=max).contains(&n) => Err(CatalogError::PlanLimit { field, max }),
        v => Ok(v),
    };
    if let Some(n) = check("maxSteps", spec.max_steps, 100)? {
        limits.max_steps = n as usize;
    }
    if let Some(n) = check("maxParallel", spec.max_parallel, 32)? {
        limits.max_parallel = n as usize;
    }
    if let Some(n) = check("maxDepth", spec.max_depth, 10)? {
        limits.max_depth = n as u32;
    }
    let year = super::MAX_CTA_EXPIRY_SECS;
    if let Some(n) = check("stepTimeoutSeconds", spec.step_timeout_seconds, year)? {
        limits.step_timeout = Some(Duration::from_secs(n));
    }
    Ok(())
}
