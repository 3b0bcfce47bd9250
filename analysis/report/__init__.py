"""Writers: an analysed run as terminal text, JSON, CSV, the HTML page and the merged timeline's
events. They format what they are given and compute nothing."""
