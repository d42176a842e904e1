"""meshshard.pipelines"""
