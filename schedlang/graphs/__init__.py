"""Graph data in memory (graph, hgraph), read (graphdata, checkmate_nx) and written (writer)."""
